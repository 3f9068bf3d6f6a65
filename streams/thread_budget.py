# SPDX-License-Identifier: Apache-2.0
"""The time budget of the thread that carried a request: where its time went
(run-queue waits, stalls on the GIL, memory and I/O, sleep, the CPU), who
woke it, and which of the group's evidence is its delay. Pure logic, no I/O;
streams/attribution.py takes a request's budget (``thread_budget``) and,
when the span names that thread, charges the request with its parts
(``carried_parts``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from jitterscope.schemas.events import BlockedWait, RequestSpan, RunqEvent
from jitterscope.streams.culprits import gil_taker
from jitterscope.streams.evidence import HostEvidence, Part, thread_parts, within

#: blocked kinds that delay a request, with the cause each names; "sleep"
#: (futex, poll, network) is where an idle thread waits for work, so it is in
#: the time budget but never a cause
STALLS = {"gil": "gil_contention", "memory": "memory_stall", "io": "io_wait"}


def kind_of(cause: str) -> str:
    """The BlockedWait kind behind a stall cause ("" for the other causes)."""
    return next((kind for kind, name in STALLS.items() if name == cause), "")


@dataclass(frozen=True)
class ThreadBudget:
    """Where the carrying thread's time went during a request (tid 0: no
    thread of the group left evidence in it)."""

    tid: int = 0
    pid: int = 0
    named: bool = False  # the span named it (thread.id)
    runq_ns: int = 0
    blocked: dict[str, int] = field(default_factory=dict)  # BlockedWait kind -> ns
    wakers: dict[str, str] = field(default_factory=dict)  # kind -> "comm[tid]" that woke it most
    gil_holders: set[int] = field(default_factory=set)  # tids of its own process that woke it from GIL waits
    gil_spans: list[tuple[int, int]] = field(default_factory=list)  # its GIL waits inside the request, in order
    devices: dict[str, int] = field(default_factory=dict)  # block device -> ns of its io waits on it

    def device(self) -> str:
        """The device it waited on longest in io ("" where none is known)."""
        return max(self.devices, key=self.devices.__getitem__, default="")

    @property
    def delay_ns(self) -> int:
        """Its run-queue waits and stalls: what it lost."""
        return self.runq_ns + sum(self.blocked.get(kind, 0) for kind in STALLS)

    def busy(self) -> bool:
        """It lost more to its own waits and stalls than it slept (a thread
        that mostly slept was waiting on other threads or processes)."""
        return self.delay_ns >= self.blocked.get("sleep", 0)

    def on_cpu_ns(self, duration_ns: int) -> int:
        """What is left of the duration: on the CPU, or in waits under the thresholds."""
        return max(0, duration_ns - self.runq_ns - sum(self.blocked.values())) if self.tid else 0


def runq_per_thread(parts: list[Part]) -> dict[tuple[int, int], int]:
    """Run-queue ns per thread (pid, tid) of a request's run-queue parts."""
    thread_waits: dict[tuple[int, int], int] = defaultdict(int)
    for event, lo, hi, _whole in parts:
        thread_waits[(event.pid, event.tid)] += hi - lo
    return thread_waits


def behind_own_ns(parts: list[Part], budget: "ThreadBudget",
                  group: set[int]) -> tuple[int, int]:
    """Run-queue ns of the carrying thread, of a request's run-queue parts,
    behind its own serving group's threads (self-contention); and of those,
    behind the threads that held the GIL it waited for. A thread that holds
    the GIL and a CPU (a busy tokenizer thread) delays it both ways: on
    2 CPUs a real vLLM's front end waited 379 ms for such a thread's GIL
    and 520 ms behind the group's threads, each under half the excess."""
    own = holders = 0
    for event, lo, hi, _whole in parts:
        if event.tid == budget.tid and event.suspect_pid in group:
            own += hi - lo
            if event.suspect_tid in budget.gil_holders:
                holders += hi - lo
    return own, holders


def thread_budget(evidence: HostEvidence, span: RequestSpan, group: set[int] | None,
                  runq_waits: dict[tuple[int, int], int], contributed: set[int]) -> ThreadBudget:
    """The time budget of the thread that carried the request: the span's
    ``thread.id`` where the group's evidence knows that thread, else the
    thread that lost the most to run-queue waits and stalls (a request
    waits on the thread that serves it; a thread's own waits cannot
    overlap, so its loss is a lower bound of the request's delay)."""
    blocked: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    wakers: dict[tuple[tuple[int, int], str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)
    gil_spans: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    devices: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for event, lo, hi, _whole in thread_parts(evidence, span.start_ns, span.end_ns, BlockedWait, group):
        thread = (event.pid, event.tid)
        blocked[thread][event.kind] += hi - lo
        if event.device:
            devices[thread][event.device] += hi - lo
        waker_pid, waker_tid, waker_comm = event.waker_pid, event.waker_tid, event.waker_comm
        if event.kind == "gil":
            gil_spans[thread].append((lo, hi))
            if not (waker_pid == event.pid and waker_tid != event.tid):  # woken by its wait's timeout
                taker = gil_taker(evidence, event)
                if taker:
                    waker_pid, waker_tid, waker_comm = taker.pid, taker.tid, taker.comm
            if waker_pid == event.pid and waker_tid != event.tid:
                holders[thread].add(waker_tid)
        if waker_tid != event.tid:  # a thread woken by itself (its own timer, as it slept) names no one
            waker = f"{waker_comm}[{waker_tid}]" if waker_pid else "interrupt"
            wakers[(thread, event.kind)][waker] += hi - lo
        contributed.add(event.pid)
    # stalls summed per thread that stalled: looking every queued thread up in ``blocked``
    # would build an empty tally apiece (a thousand threads of a large group)
    stalls = {thread: sum(by.get(k, 0) for k in STALLS) for thread, by in blocked.items()}
    lost = {thread: runq_waits.get(thread, 0) + stalls.get(thread, 0) for thread in runq_waits.keys() | blocked.keys()}
    named = [thread for thread in lost if thread[1] == span.tid] if span.tid else []
    carrier = named[0] if named else max(lost, key=lost.__getitem__, default=None)
    if carrier is None:
        return ThreadBudget()
    return ThreadBudget(tid=carrier[1], pid=carrier[0], named=bool(named), runq_ns=runq_waits.get(carrier, 0),
                   blocked=dict(blocked.get(carrier, {})),
                   wakers={kind: max(by, key=by.__getitem__)
                           for (thread, kind), by in wakers.items() if thread == carrier},
                   gil_holders=holders.get(carrier, set()), gil_spans=sorted(gil_spans.get(carrier, [])),
                   devices=dict(devices.get(carrier, {})))


def carried_parts(parts: dict[type, list[Part]],
                  budget: ThreadBudget) -> dict[type, list[Part]]:
    """The parts that delayed a request its span's thread carried: that
    thread's own waits, and those of the threads that held the GIL it
    waited for, where they overlap its GIL waits: a holder kept off the CPU
    (preempted, throttled) while it held the lock made it wait that long.
    The GIL wait stays whole in the thread's budget; the holders' waits
    inside it are candidates too, and the larger names the cause (a quota
    that throttles the holder, not the GIL)."""
    own = {kind: [p for p in found if p[0].tid == budget.tid] for kind, found in parts.items()}
    held = [piece for p in parts[RunqEvent] if p[0].tid in budget.gil_holders
            for piece in within(p, budget.gil_spans)]
    own[RunqEvent] = sorted(own[RunqEvent] + held, key=lambda p: p[1])
    return own
