# SPDX-License-Identifier: Apache-2.0
"""`fix --verify`'s verdict: a change is called one only when the P99's
bootstrap interval excludes no change; each cause's share before and after."""

from __future__ import annotations

import random

from jitterscope.reports.fix_verify import format_verdicts, verdicts

MS = 1_000_000


def rows(after: bool, durations_ms, cause: str):
    return [("llm_request", after, int(ms * MS), cause) for ms in durations_ms]


def spread(rng: random.Random, low: float, high: float, n: int = 300):
    return [rng.uniform(low, high) for _ in range(n)]


def test_a_fix_that_cut_the_tail_is_called_one():
    rng = random.Random(1)
    found, shares = verdicts(rows(False, spread(rng, 40, 120), "runq_starvation")
                             + rows(True, spread(rng, 10, 14), "none"), random.Random(0))
    [v] = found
    assert v.worked and not v.worse and v.requests == (300, 300)
    assert v.before["P99"] > 100 and v.after["P99"] < 15
    assert shares == {"runq_starvation": (1.0, 0.0), "none": (0.0, 1.0)}
    text = "\n".join(format_verdicts(found, shares, "13:25:01 (move:jshog)"))
    assert "the fix worked: P99" in text and "runq_starvation 100% -> 0%" in text


def test_the_same_latency_is_not_proven_and_worse_is_said():
    rng = random.Random(2)
    same, _ = verdicts(rows(False, spread(rng, 10, 20), "none") + rows(True, spread(rng, 10, 20), "none"),
                       random.Random(0))
    assert not same[0].worked and not same[0].worse
    assert "not proven" in "\n".join(format_verdicts(same, {}, "now"))
    worse, _ = verdicts(rows(False, spread(rng, 10, 14), "none") + rows(True, spread(rng, 40, 120), "runq_starvation"),
                        random.Random(0))
    assert worse[0].worse and "fix --undo" in "\n".join(format_verdicts(worse, {}, "now"))


def test_nothing_after_the_apply_yet_says_so():
    found, _ = verdicts(rows(False, [10, 11], "none"), random.Random(0))
    assert found == [] and "run it again later" in format_verdicts(found, {}, "now")[0]
