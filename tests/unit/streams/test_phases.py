# SPDX-License-Identifier: Apache-2.0
"""A request's answer per phase (streams/phases.py): where vLLM's queue,
prefill and decode sit on the request's timeline, and which cause took
each: the GIL in the queue, a neighbour in the decode."""

from __future__ import annotations

from msgspec.structs import replace

from jitterscope.streams.attribution import Attributor
from jitterscope.streams.phases import windows
from tests.unit.streams.test_attribution import GRACE, MS, T0, baseline, blocked, due_after, span, wait


def phased(start_ms: float, end_ms: float, queue: float, prefill: float, decode: float, ttft: float = 0, **kw):
    return replace(span("p", start_ms, end_ms, **kw), queue_ns=int(queue * MS), prefill_ns=int(prefill * MS),
                   decode_ns=int(decode * MS), ttft_ns=int(ttft * MS))


def relative(ws):
    return [(name, (lo - T0) / MS, (hi - T0) / MS) for name, lo, hi in ws]


def test_phases_sit_around_the_first_token_and_the_rest_is_the_front_ends():
    # TTFT 35 ms: prefill ends there, the queue before it, the front end's 5 ms before that; decode follows the
    # first token for 30 ms, and the 5 ms after the last token are output
    assert relative(windows(phased(0, 70, queue=20, prefill=10, decode=30, ttft=35))) == [
        ("front", 0, 5), ("queue", 5, 25), ("prefill", 25, 35), ("decode", 35, 65), ("output", 65, 70)]
    # without a TTFT it ends with its last token: the first comes decode_ns before the end
    assert relative(windows(phased(0, 70, queue=20, prefill=10, decode=30))) == [
        ("front", 0, 10), ("queue", 10, 30), ("prefill", 30, 40), ("decode", 40, 70)]


def test_a_phase_is_clipped_to_the_span_and_a_span_without_phases_has_none():
    assert relative(windows(phased(0, 50, queue=40, prefill=10, decode=20))) == [
        ("queue", 0, 20), ("prefill", 20, 30), ("decode", 30, 50)]
    assert relative(windows(phased(0, 50, queue=0, prefill=0, decode=50))) == [("decode", 0, 50)]
    assert windows(span("plain", 0, 50)) == []


def test_each_phase_is_named_for_what_took_it():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    # 100 ms: queue 0-60 (TTFT 80, prefill 20), decode 80-100. In the queue the serving thread waits for the
    # GIL 3 x 10 ms, its holder gil-hog; in the decode it waits 15 ms for a CPU behind jshog
    for end in (10, 30, 50):
        a.add_evidence(blocked(end, 10))
    a.add_evidence(wait(on_cpu_ms=95, wait_ms=15))
    a.add_request(phased(0, 100, queue=60, prefill=20, decode=20, ttft=80))
    [r] = due_after(a, 100)
    queue, prefill, decode = r.phases  # TTFT 80 = queue 60 + prefill 20: no front; decode to the end: no output
    assert (queue.phase, queue.ns, queue.cause, queue.culprit) == ("queue", 60 * MS, "gil_contention", "gil-hog[177]")
    assert queue.cause_ns == 30 * MS and queue.gil_ns == 30 * MS and queue.runq_ns == 0
    assert (prefill.phase, prefill.ns, prefill.cause, prefill.cause_ns) == ("prefill", 20 * MS, "", 0)
    assert (decode.phase, decode.cause, decode.culprit) == ("decode", "runq_starvation", "jshog")
    assert decode.cause_ns == 15 * MS and decode.runq_ns == 15 * MS and decode.gil_ns == 0


def test_a_request_without_excess_gets_no_phases():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(phased(0, 10, queue=2, prefill=3, decode=5))
    [r] = due_after(a, 10)
    assert r.cause == "none" and r.phases == []


def test_the_request_alert_says_which_cause_took_which_phase():
    from jitterscope.schemas.events import PhasePart
    from jitterscope.streams.rules.requests import request_slo
    from tests.unit.streams.rules.test_rules import NOW, attribution

    a = attribution(phases=[
        PhasePart(phase="queue", ns=700 * MS, cause="gil_contention", cause_ns=650 * MS, culprit="gil-hog[123]"),
        PhasePart(phase="prefill", ns=30 * MS, cause="", cause_ns=0, culprit=""),
        PhasePart(phase="decode", ns=170 * MS, cause="runq_starvation", cause_ns=20 * MS, culprit="jshog")])
    alert = request_slo(a, "vllm", [0], [0, 1], NOW)
    assert alert.summary.endswith("; by phase: queue 700 ms (650 ms gil_contention, gil-hog[123]), prefill 30 ms, "
                                  "decode 170 ms (20 ms runq_starvation, jshog)"), alert.summary
