# SPDX-License-Identifier: Apache-2.0
"""Wait-for chains: a request whose thread slept until another thread woke
it was delayed by whatever delayed that thread (wPerf's wait-for graphs,
OSDI'18). Pure logic, no I/O; streams/attribution.py asks for a request's
chain when its carrying thread slept through a share of its excess.

From the carrying thread, over the request: the thread that woke it from
most of its sleep (BlockedWait's waker; a thread's own timer and interrupts
wake no one) is the first hop. Over the sleeps it ended, what took that
thread's time: its run-queue waits (the neighbour that held its CPU), its
stalls (GIL, memory, I/O, with their holder, waker or device), its own
sleeps (then the thread that woke it is the next hop), or else its own work
on the CPU. Up to MAX_HOPS hops, never the same thread twice (a cycle ends
it), only through threads of the request's serving group: the only ones
whose waits the collector sends.

A chain's stalls weigh as causes of the request (``chained_stalls``): the
serving group's run-queue waits are already charged, whichever thread
waited, but a stall counted only on the carrying thread.
"""

from __future__ import annotations

from collections import defaultdict

from jitterscope.schemas.events import BlockedWait, ChainHop, RunqEvent
from jitterscope.streams.evidence import HostEvidence, thread_parts, within
from jitterscope.streams.thread_budget import STALLS

#: On a real vLLM the thread that does the work is the fourth hop from the
#: API server's: its ZMQ I/O thread, the engine's ZMQ I/O thread and the
#: engine's output thread only pass the wake-up on (each slept through the
#: sleeps it ended). At 3 the chain ended on a relay's sleep; at 6 it reaches
#: the engine's busy thread and what held it up (tests/vllm).
MAX_HOPS = 6


def _pieces(evidence: HostEvidence, kind: type, thread: tuple[int, int],
            spans: list[tuple[int, int]]) -> list[tuple]:
    """A thread's ``kind`` parts inside ``spans`` (sorted, not overlapping)."""
    pid, tid = thread
    found = thread_parts(evidence, spans[0][0], spans[-1][1], kind, {pid})
    return [piece for part in found if part[0].tid == tid for piece in within(part, spans)]


def _woken_by(sleeps: list[tuple], thread: tuple[int, int]) -> tuple[tuple[int, int], str, list] | None:
    """The thread that woke ``thread`` from most of its ``sleeps``, its
    name, and the sleeps it ended; None where no other task woke it."""
    by: dict[tuple[int, int], list] = defaultdict(list)
    names = {}
    for piece in sleeps:
        event = piece[0]
        if event.kind == "sleep" and event.waker_pid and event.waker_tid != thread[1]:
            waker = (event.waker_pid, event.waker_tid)
            by[waker].append(piece)
            names[waker] = event.waker_comm
    if not by:
        return None
    waker = max(by, key=lambda w: sum(hi - lo for _e, lo, hi, _w in by[w]))
    return waker, names[waker], by[waker]


def _delays(evidence: HostEvidence, thread: tuple[int, int], spans: list[tuple[int, int]],
            group: set[int]) -> tuple[dict[str, int], dict[str, str], list]:
    """Where a thread's time went over ``spans``: ns per kind (runq, the
    BlockedWait kinds, cpu: the rest), who is behind each, and its sleeps."""
    took: dict[str, int] = defaultdict(int)
    neighbours: dict[str, int] = defaultdict(int)
    culprits: dict[str, str] = {}
    for event, lo, hi, _whole in _pieces(evidence, RunqEvent, thread, spans):
        took["runq"] += hi - lo
        if event.suspect_pid and event.suspect_pid not in group:
            neighbours[event.suspect_comm] += hi - lo
    if neighbours:
        culprits["runq"] = max(neighbours, key=neighbours.__getitem__)
    blocked = _pieces(evidence, BlockedWait, thread, spans)
    for event, lo, hi, _whole in blocked:
        took[event.kind] += hi - lo
        if event.kind == "io" and event.device:
            culprits["io"] = event.device
        elif event.kind != "sleep" and event.waker_pid and event.waker_tid != event.tid:
            culprits.setdefault(event.kind, f"{event.waker_comm}[{event.waker_tid}]")
    took["cpu"] = max(0, sum(hi - lo for lo, hi in spans) - sum(took.values()))
    return took, culprits, blocked


def wait_chain(evidence: HostEvidence, group: set[int], carrier: tuple[int, int],
               start_ns: int, end_ns: int) -> list[ChainHop]:
    """The hops from the carrying thread over [start_ns, end_ns]."""
    hops: list[ChainHop] = []
    seen = {carrier}
    edge = _woken_by(_pieces(evidence, BlockedWait, carrier, [(start_ns, end_ns)]), carrier)
    while edge is not None and len(hops) < MAX_HOPS and edge[0] not in seen and edge[0][0] in group:
        waker, comm, ended = edge
        spans = [(lo, hi) for _e, lo, hi, _w in ended]
        took, culprits, sleeps = _delays(evidence, waker, spans, group)
        kind = max(took, key=took.__getitem__)
        edge = _woken_by(sleeps, waker) if kind == "sleep" else None  # the next hop, and this one's culprit
        hops.append(ChainHop(tid=waker[1], comm=comm, waited_ns=sum(hi - lo for lo, hi in spans), kind=kind,
                             ns=took[kind], culprit=f"{edge[1]}[{edge[0][1]}]" if edge else culprits.get(kind, "")))
        seen.add(waker)
    return hops


def chained_stalls(hops: list[ChainHop]) -> dict[str, int]:
    """The chain's stalls as causes (cause -> ns): the last hop's, where it
    stalled; no more than the first hop's sleep, which is the request's."""
    if not hops or hops[-1].kind not in STALLS:
        return {}
    return {STALLS[hops[-1].kind]: min(hops[-1].ns, hops[0].waited_ns)}
