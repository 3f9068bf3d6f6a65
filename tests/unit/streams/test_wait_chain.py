# SPDX-License-Identifier: Apache-2.0
"""streams/wait_chain.py and its use in attribution: a request whose thread
slept until another thread woke it is charged with what delayed that thread,
hop by hop (vLLM's front end asleep while its engine waits), and its causes
stack, each with its share."""

from __future__ import annotations

import pytest

from jitterscope.schemas.events import ChainHop, RequestSpan
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.wait_chain import MAX_HOPS, chained_stalls, wait_chain
from tests.unit.streams.test_attribution import (GRACE, MS, T0, baseline, blocked, book, due_after, engine_wait,
                                                  process, span)

FRONT, ENGINE, DETOK = (100, 101), (200, 201), (100, 177)


def group_of_two() -> Attributor:
    """The front (pid 100, which sends the spans) and its engine (pid 200), taught a 10 ms normal."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))
    baseline(a)
    return a


def front_asleep_on(a: Attributor, waker: tuple[int, int, str], until_ms: float = 90) -> None:
    """The front's thread (the span's) sleeps 10..until_ms, woken by ``waker`` in 4 sleeps."""
    step = (until_ms - 10) / 4
    for k in range(4):
        a.add_evidence(blocked(10 + step * (k + 1), step, kind="sleep", waker=waker))


def request(a: Attributor, end_ms: float = 100):
    named = span("r", 0, end_ms)
    a.add_request(RequestSpan(**{**{f: getattr(named, f) for f in named.__struct_fields__}, "tid": FRONT[1]}))
    [r] = due_after(a, end_ms)
    return r


def test_a_front_end_asleep_on_a_starved_engine_names_the_engine_and_its_neighbour():
    a = group_of_two()
    front_asleep_on(a, (200, 201, "VLLM::EngineCor"))
    a.add_evidence(engine_wait(on_cpu_ms=80, wait_ms=60))  # the engine waited 20..80 behind jshog
    r = request(a)
    assert r.chain == [ChainHop(tid=201, comm="VLLM::EngineCor", waited_ns=80 * MS, kind="runq", ns=60 * MS,
                                culprit="jshog")]
    assert (r.cause, r.culprit) == ("runq_starvation", "jshog")


def test_an_engine_stalled_on_its_gil_is_the_request_s_cause_through_the_edge():
    a = group_of_two()
    front_asleep_on(a, (200, 201, "VLLM::EngineCor"))
    a.add_evidence(blocked(85, 70, kind="gil", pid=200, tid=201, waker=(200, 209, "detok")))  # 15..85
    r = request(a)
    assert r.chain == [ChainHop(tid=201, comm="VLLM::EngineCor", waited_ns=80 * MS, kind="gil", ns=70 * MS,
                                culprit="detok[209]")]
    assert (r.cause, r.culprit) == ("gil_contention", "detok[209]")
    assert r.causes[0].cause == "gil_contention" and r.causes[0].share == pytest.approx(70 / 90, abs=1e-3)
    assert r.explained == pytest.approx(70 / 90, abs=1e-3)


def test_a_chain_follows_sleeps_to_the_thread_that_was_held_up():
    a = group_of_two()
    front_asleep_on(a, (200, 201, "VLLM::EngineCor"))
    # the engine slept on the front's detokenizer thread, which waited for a CPU behind a neighbour
    a.add_evidence(blocked(88, 75, kind="sleep", pid=200, tid=201, waker=(100, 177, "detok")))  # 13..88
    a.add_evidence(engine_wait(on_cpu_ms=85, wait_ms=65, pid=100, tid=177, suspect=(900, "backup")))
    r = request(a)
    assert [(h.tid, h.kind, h.culprit) for h in r.chain] == [(201, "sleep", "detok[177]"), (177, "runq", "backup")]
    assert r.chain[1].waited_ns == 75 * MS and r.chain[1].ns == 65 * MS
    assert (r.cause, r.culprit) == ("runq_starvation", "backup")


def test_a_cycle_or_a_thread_outside_the_group_ends_the_chain():
    a = group_of_two()
    front_asleep_on(a, (200, 201, "VLLM::EngineCor"))
    a.add_evidence(blocked(88, 75, kind="sleep", pid=200, tid=201, waker=(100, 101, "vllm")))  # woken by the front
    r = request(a)
    assert [(h.tid, h.kind, h.culprit) for h in r.chain] == [(201, "sleep", "vllm[101]")]
    b = group_of_two()
    front_asleep_on(b, (300, 301, "redis"))  # a process the collector sends no waits of
    assert request(b).chain == []


def test_a_chain_stops_at_max_hops():
    pids = [100 * k for k in range(1, MAX_HOPS + 4)]
    a = Attributor(grace_ns=GRACE, processes=book(*(process(p, group=100) for p in pids)))
    baseline(a)
    front_asleep_on(a, (200, 201, "t200"))
    for pid in pids[1:]:
        a.add_evidence(blocked(89, 78, kind="sleep", pid=pid, tid=pid + 1, waker=(pid + 100, pid + 101, f"t{pid + 100}")))
    r = request(a)
    assert [h.tid for h in r.chain] == [p + 1 for p in pids[1:MAX_HOPS + 1]] and all(h.kind == "sleep" for h in r.chain)


def test_a_thread_that_slept_on_its_own_timer_has_no_chain():
    a = group_of_two()
    front_asleep_on(a, (0, FRONT[1], "vllm"))  # its own timer: no one to follow
    r = request(a)
    assert r.chain == [] and r.cause == "unexplained" and r.explained == 0.0


def test_stacked_causes_are_listed_with_their_shares():
    a = group_of_two()
    # the span's thread waits 30 ms for the GIL, then 20 ms for a CPU behind a neighbour
    a.add_evidence(blocked(40, 30, kind="gil", waker=(100, 177, "detok")))
    a.add_evidence(engine_wait(on_cpu_ms=60, wait_ms=20, pid=100, tid=101, suspect=(900, "backup")))
    r = request(a, end_ms=60)
    assert [(c.cause, round(c.share, 3)) for c in r.causes] == [("gil_contention", 0.6), ("runq_starvation", 0.4)]
    assert r.cause == "gil_contention" and r.explained == pytest.approx(1.0)


def test_only_a_last_hop_stall_is_chained():
    hop = ChainHop(tid=1, comm="a", waited_ns=50 * MS, kind="memory", ns=80 * MS, culprit="")
    assert chained_stalls([hop]) == {"memory_stall": 50 * MS}, "never more than the request's own sleep"
    assert chained_stalls([ChainHop(tid=1, comm="a", waited_ns=5, kind="runq", ns=5, culprit="x")]) == {}
    assert chained_stalls([]) == {}
    assert wait_chain({}, {100}, FRONT, T0, T0 + 10 * MS) == []
