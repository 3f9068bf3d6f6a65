# SPDX-License-Identifier: Apache-2.0
"""`jitterscope fix --verify`: did the changes `--apply` made cut the
serving group's request latency? Before (the ``--since`` before the apply)
against after (since it), per span name: P50, P99 and P999, and a bootstrap
interval of the P99's change. Only a change outside that interval is
called one: "the fix worked", or "it made things worse". Each cause's share
of the requests, before and after, says which cause went away.

Pure: the caller passes the rows and a seeded random source.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass

from jitterscope.reports.fix_plan import percentile

SQL = """
    SELECT name, toUnixTimestamp64Nano(ts) >= {applied:Int64} AS after, duration_ns, cause
    FROM jitterscope.request_attribution FINAL
    WHERE host = {host:String} AND ts >= fromUnixTimestamp64Nano({from_ns:Int64})"""

RESAMPLES = 1000
QUANTILES = ((0.5, "P50"), (0.99, "P99"), (0.999, "P999"))


@dataclass(frozen=True)
class Verdict:
    name: str
    before: dict[str, float]  # "P50" -> ms
    after: dict[str, float]
    p99_interval: tuple[float, float]  # 95% interval of P99 after - before, ms
    requests: tuple[int, int]

    @property
    def worked(self) -> bool:
        return self.p99_interval[1] < 0

    @property
    def worse(self) -> bool:
        return self.p99_interval[0] > 0


def p99_interval(before: list[float], after: list[float], rng: random.Random,
                 resamples: int = RESAMPLES) -> tuple[float, float]:
    """The 95% bootstrap interval of P99(after) - P99(before)."""
    diffs = sorted(percentile(rng.choices(after, k=len(after)), 0.99)
                   - percentile(rng.choices(before, k=len(before)), 0.99) for _ in range(resamples))
    return diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


def verdicts(rows: list, rng: random.Random) -> tuple[list[Verdict], dict[str, tuple[float, float]]]:
    """(per span name with requests on both sides, each cause's share of the requests before and after)."""
    durations: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    causes: tuple[Counter, Counter] = (Counter(), Counter())
    for name, after, duration_ns, cause in rows:
        durations[name][bool(after)].append(duration_ns / 1e6)
        causes[bool(after)][cause] += 1
    found = []
    for name, (before, after) in sorted(durations.items()):
        if before and after:
            found.append(Verdict(name, {q: percentile(before, f) for f, q in QUANTILES},
                                 {q: percentile(after, f) for f, q in QUANTILES}, p99_interval(before, after, rng),
                                 (len(before), len(after))))
    totals = [sum(c.values()) or 1 for c in causes]
    shares = {cause: (causes[0][cause] / totals[0], causes[1][cause] / totals[1])
              for cause in sorted(causes[0].keys() | causes[1].keys())}
    return found, shares


def format_verdicts(found: list[Verdict], shares: dict[str, tuple[float, float]], applied: str) -> list[str]:
    if not found:
        return [f"applied {applied}: no span name has requests both before and after it yet; run it again later"]
    lines = [f"applied {applied}; before: the --since before it, after: since it"]
    for v in found:
        low, high = v.p99_interval
        lines.append(f"{v.name} ({v.requests[0]} -> {v.requests[1]} requests): "
                     + ", ".join(f"{q} {v.before[q]:.1f} -> {v.after[q]:.1f} ms" for _, q in QUANTILES)
                     + f"; P99 change {v.after['P99'] - v.before['P99']:+.1f} ms "
                       f"(95% interval {low:+.1f} .. {high:+.1f})")
        ratio = v.before["P99"] / v.after["P99"] if v.after["P99"] else float("inf")
        lines.append(f"  the fix worked: P99 {ratio:.1f}x lower" if v.worked else
                     "  it made things worse: P99 higher (jitterscope fix --undo takes it back)" if v.worse else
                     "  no change outside the interval: not proven either way")
    lines.append("causes (share of requests): " + "; ".join(
        f"{cause} {b:.0%} -> {a:.0%}" for cause, (b, a) in sorted(shares.items(), key=lambda kv: -kv[1][0])))
    return lines
