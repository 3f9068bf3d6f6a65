# SPDX-License-Identifier: Apache-2.0
"""Per-request root cause: which kernel evidence overlapped a request.

Pure logic, no I/O: the worker feeds it evidence and request spans as they
arrive (in any order) and asks, on a timer, for the requests whose span ended
more than ``grace_ns`` ago, by then late kernel evidence has arrived too.

Evidence is matched at process level: a run-queue wait counts for a request
when it happened on a thread of the request's serving group (the span's
process and the processes the collector found serving with it, e.g. vLLM's
EngineCore: ProcessInfo.serving_group; any thread of the host when the
process is not known) and overlapped the request's time window; only the
overlapping part counts, and a thread's time is counted once (a redelivered
or re-primed event does not double it). Requests served together
(continuous batching) overlap the same waits and each is charged with them:
they really were all delayed by them.

A wait is then split by what kept the CPU from the thread:

- ``cfs_throttling``: the part that overlaps intervals in which the cgroup of
  the thread's process (or an ancestor: a pod's limit throttles its
  containers) was throttled. A CgroupThrottle record only says how long the
  cgroup was throttled over its interval, not when, so the charge assumes it
  was spread evenly: throttled_ns x overlap / interval_ns, at most the
  overlap. Exception: when nothing else ran on the CPU during the wait (its
  suspect is the idle task, pid 0), a runnable thread can only have been
  held back by its quota, and the whole overlap is throttling.
- ``irq``: interrupt time on the wait's CPU during the wait: each
  overlapping IrqTime interval's time_ns prorated by the overlap (again
  assuming an even spread), at most what the wait has left after throttling.
- ``self_contention``: of the rest, what the group's own threads held (the
  CPU's holder is a process of the request's serving group): more runnable
  threads than CPUs. It is never charged to a neighbour, and the group's own
  threads are never suspects.
- ``runq_starvation``: the rest; only this part is charged to the suspects
  (the tasks outside the group that held the CPU).
"""

from __future__ import annotations

import bisect
import functools
import operator
import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field

from typing import Protocol

from jitterscope.schemas.events import (BlockedWait, CgroupThrottle, GpuIoctl, IrqTime, PagePlacement, ProcessInfo,
                                        RequestAttribution, RequestSpan, RunqEvent, Suspect)
from jitterscope.schemas.nvidia import ioctl_name

Evidence = RunqEvent | GpuIoctl | CgroupThrottle | IrqTime | BlockedWait | PagePlacement

#: blocked kinds that delay a request, with the cause each names; "sleep"
#: (futex, poll, network) is where an idle thread waits for work, so it is in
#: the time budget but never a cause
STALLS = {"gil": "gil_contention", "memory": "memory_stall", "io": "io_wait"}


def duration_ns(event: Evidence) -> int:
    """How long the evidence lasted, ending at ts_ns: the wait or the call
    of a thread, or the interval a cgroup's or a CPU's sums cover."""
    if isinstance(event, RunqEvent):
        return event.wait_ns
    if isinstance(event, GpuIoctl):
        return event.latency_ns
    if isinstance(event, BlockedWait):
        return event.blocked_ns
    return event.interval_ns


def _index(event: Evidence) -> int | str:
    """What evidence of its kind is looked up by: the process for a
    thread's evidence, the cgroup for throttling, the CPU for interrupts."""
    if isinstance(event, CgroupThrottle):
        return event.cgroup
    if isinstance(event, IrqTime):
        return event.cpu
    if isinstance(event, PagePlacement):
        return HOST_PAGES
    return event.pid


@functools.lru_cache(maxsize=65536)  # asked for every wait a request overlaps; a host has few cgroups
def _ancestors(cgroup: str) -> tuple[str, ...]:
    """The cgroup and the ones above it (not the root: it has no limit)."""
    parts = [p for p in cgroup.split("/") if p]
    return tuple("/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1))


def shares_limit(limit: str, other: str) -> bool:
    """Whether a process in memory cgroup ``other`` is charged under
    ``limit`` (a memory cgroup below the root): one is the other or below it."""
    if not other:
        return False
    a, b = limit.rstrip("/") + "/", other.rstrip("/") + "/"
    return a.startswith(b) and b != "/" or b.startswith(a)


class ProcessBook(Protocol):
    """What the attributor asks the worker's host state (HostState)."""

    processes: dict[tuple[str, int], ProcessInfo]

    def serving_group(self, host: str, pid: int) -> set[int]: ...


@dataclass(frozen=True)
class Culprits:
    """The records behind a request's throttling and interrupt charges, for
    a remedy that names the limit or the interrupt (None: none charged)."""

    throttle: CgroupThrottle | None = None  # the latest interval of the cgroup charged most
    irq: IrqTime | None = None  # the interrupt source charged most, with its CPU

#: the key of a host's page placements (one list: the evictor is looked for host-wide)
HOST_PAGES = "pages"
#: how far before a memory stall to look for who filled memory: an archiver
#: that buffered its logs a while ago still holds what it took
EVICTOR_LOOKBACK_NS = 60_000_000_000


def _within(part: tuple, spans: list[tuple[int, int]]) -> list[tuple]:
    """The pieces of a (event, lo, hi, whole) part inside ``spans`` (sorted,
    not overlapping), each a part of its own (no longer whole)."""
    event, lo, hi, _whole = part
    return [(event, max(lo, a), min(hi, b), False) for a, b in spans if a < hi and b > lo]


def kind_of(cause: str) -> str:
    """The BlockedWait kind behind a stall cause ("" for the other causes)."""
    return next((kind for kind, name in STALLS.items() if name == cause), "")


@dataclass(frozen=True)
class _Budget:
    """Where the carrying thread's time went during a request (tid 0: no
    thread of the group left evidence in it)."""

    tid: int = 0
    named: bool = False  # the span named it (thread.id)
    runq_ns: int = 0
    blocked: dict[str, int] = field(default_factory=dict)  # BlockedWait kind -> ns
    wakers: dict[str, str] = field(default_factory=dict)  # kind -> "comm[tid]" that woke it most
    gil_holders: set[int] = field(default_factory=set)  # tids of its own process that woke it from GIL waits
    gil_spans: list[tuple[int, int]] = field(default_factory=list)  # its GIL waits inside the request, in order

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


TOP_SUSPECTS = 3
# A GIL wait woken by its timeout is charged to the thread that took the GIL
# from the waiter at most this long before the wait began (a switch interval:
# a thread asked to drop the GIL asks for it back at once) ...
GIL_HANDOFF_NS = 5_000_000
# ... or this long after (a merged wait's start, ts - blocked_ns, is late by
# the moments on the CPU between its parts)
GIL_HANDOFF_SLACK_NS = 1_000_000
_THREAD_ORDER = operator.itemgetter(0, 1, 2)  # a part's (pid, tid, start): one thread's parts in time order
# Excess under max(1 ms, a quarter of the baseline) is ordinary jitter: nothing to explain.
NO_EXCESS_NS = 1_000_000
NO_EXCESS_SHARE = 0.25
DOMINANT_SHARE = 0.5  # a cause must explain at least half the excess to be named
MAX_WAITS_PER_PROCESS = 200_000  # memory bound per process, whatever the horizon
REMEMBERED_KEYS = 1_000_000  # attributed span keys kept, to skip redelivered spans


@dataclass
class _Evidence:
    """One process's recent evidence of one kind, sorted by start."""

    starts: list[int] = field(default_factory=list)  # ts - duration, sorted
    events: list[Evidence] = field(default_factory=list)  # in the same order
    longest_ns: int = 0  # longest one kept: how far before a request to look

    def add(self, event: Evidence, length: int | None = None) -> None:
        if length is None:
            length = duration_ns(event)
        start = event.ts_ns - length
        if not self.starts or start >= self.starts[-1]:  # in order, the usual case: no search, no shift
            self.starts.append(start)
            self.events.append(event)
        else:
            index = bisect.bisect_right(self.starts, start)
            self.starts.insert(index, start)
            self.events.insert(index, event)
        self.longest_ns = max(self.longest_ns, length)
        if len(self.events) > MAX_WAITS_PER_PROCESS:
            drop = MAX_WAITS_PER_PROCESS // 10  # the oldest tenth, in one go
            del self.starts[:drop]
            del self.events[:drop]

    def expire(self, before_ns: int) -> None:
        cut = bisect.bisect_left(self.starts, before_ns)
        if cut:
            del self.starts[:cut]
            del self.events[:cut]

    def overlapping_range(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """The index range of the events that may overlap [start, end]."""
        return (bisect.bisect_left(self.starts, start_ns - self.longest_ns),
                bisect.bisect_right(self.starts, end_ns))

    def overlapping(self, start_ns: int, end_ns: int) -> list[Evidence]:
        first, last = self.overlapping_range(start_ns, end_ns)
        return self.events[first:last]


def _kth_smallest(lists: list[list[int]], k: int) -> int:
    """The k-th smallest (from 0) of the values of sorted lists, as sorting
    them all would give, by bisecting the value range: O(log range x lists
    x log n), not O(n log n) -- a storm sheds every few thousand events."""
    lo, hi = min(l[0] for l in lists), max(l[-1] for l in lists)
    while lo < hi:  # the smallest value with more than k values at or below it
        mid = (lo + hi) // 2
        if sum(bisect.bisect_right(l, mid) for l in lists) > k:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _union_ns(parts: list[tuple[Evidence, int, int, bool]]) -> int:
    """How long at least one of the parts ([lo, hi] of each) lasted."""
    total, end = 0, None
    for lo, hi in sorted((part[1], part[2]) for part in parts):
        if end is None or lo >= end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def overlap_ns(event: Evidence, start_ns: int, end_ns: int) -> int:
    """How much of the event's [ts - duration, ts] lies inside [start, end]."""
    return max(0, min(end_ns, event.ts_ns) - max(start_ns, event.ts_ns - duration_ns(event)))


class Attributor:
    def __init__(self, grace_ns: int = 2_000_000_000, horizon_ns: int = 300_000_000_000,
                 slo_ns: int | None = None, slo_factor: float = 5.0, min_samples: int = 20,
                 baseline_window: int = 500, max_events_per_host: int = 200_000,
                 max_pending: int = 100_000, processes: ProcessBook | None = None):
        self.grace_ns = grace_ns
        self.horizon_ns = horizon_ns
        self.slo_ns = slo_ns
        self.slo_factor = slo_factor
        self.min_samples = min_samples
        self.processes = processes  # serving groups and cgroups; None = each process alone, no cgroups
        self._culprits: dict[tuple[str, str, int], Culprits] = {}  # of the last due() batch
        self._splits: dict[int, tuple] = {}  # id(wait) -> _split() of the whole wait, during one due()
        # host -> (pid | cgroup | cpu, kind) -> evidence; requests look up their processes directly
        self._evidence: dict[str, dict[tuple[int | str, type], _Evidence]] = defaultdict(lambda: defaultdict(_Evidence))
        self._newest: dict[str, int] = defaultdict(int)
        self._pending: list[RequestSpan] = []
        self._durations: dict[tuple[str, str], deque[int]] = defaultdict(lambda: deque(maxlen=baseline_window))
        self._attributed_until: dict[str, int] = {}
        self._events_per_host: dict[str, int] = defaultdict(int)
        self.max_events_per_host = max_events_per_host
        self.max_pending = max_pending
        # keys of attributed spans, oldest first: a span Kafka redelivers (or
        # a restart re-reads) is not attributed, stored and counted twice
        self._attributed: dict[tuple[str, str, int], None] = {}
        self.late_evidence = 0
        self.evidence_evicted = 0  # kept out of the window by the count bound, not by age

    # -- input -------------------------------------------------------------
    def add_evidence(self, event: Evidence) -> None:
        if isinstance(event, (CgroupThrottle, IrqTime)) and not (
                event.interval_ns and (event.throttled_ns if isinstance(event, CgroupThrottle) else event.time_ns)):
            return  # an interval with nothing to charge (or none at all): not worth its memory
        if event.ts_ns - duration_ns(event) < self._attributed_until.get(event.host, 0):
            self.late_evidence += 1  # some request it overlapped may already be out
        self._evidence[event.host][(_index(event), type(event))].add(event)
        self._events_per_host[event.host] += 1
        if event.ts_ns > self._newest[event.host] + self.horizon_ns // 10:
            # expire in steps of a tenth of the horizon, not on every event
            self._newest[event.host] = event.ts_ns
            self._expire(event.host, self._newest[event.host] - self.horizon_ns)
        if self._events_per_host[event.host] > self.max_events_per_host:
            self._shed(event.host)

    def add_evidence_many(self, records: list[Evidence]) -> None:
        """add_evidence of each record in turn, with the same result; a
        message's run-queue events (the bulk: 100k+ a second per worker)
        take an inlined loop with no per-event type dispatch."""
        if not records or type(records[0]) is not RunqEvent:
            for record in records:
                self.add_evidence(record)
            return
        evidence, until, newest, counts = self._evidence, self._attributed_until, self._newest, self._events_per_host
        step = self.horizon_ns // 10
        for event in records:
            if type(event) is not RunqEvent:
                self.add_evidence(event)
                continue
            host, ts, length = event.host, event.ts_ns, event.wait_ns
            if ts - length < until.get(host, 0):
                self.late_evidence += 1
            evidence[host][(event.pid, RunqEvent)].add(event, length)
            counts[host] += 1
            if ts > newest[host] + step:
                newest[host] = ts
                self._expire(host, ts - self.horizon_ns)
            if counts[host] > self.max_events_per_host:
                self._shed(host)

    def remember(self, done: RequestAttribution) -> None:
        """Count an earlier attribution into the baseline (priming after a restart)."""
        self._durations[(done.host, done.name)].append(done.service_ns or done.duration_ns)
        self._mark_attributed(done)

    def add_request(self, span: RequestSpan) -> None:
        if (span.host, span.boot_id, span.seq) not in self._attributed:
            self._pending.append(span)

    def _mark_attributed(self, record: RequestSpan | RequestAttribution) -> None:
        self._attributed[(record.host, record.boot_id, record.seq)] = None
        if len(self._attributed) > REMEMBERED_KEYS:
            del self._attributed[next(iter(self._attributed))]

    def _expire(self, host: str, before_ns: int) -> None:
        processes = self._evidence[host]
        for key, evidence in list(processes.items()):
            evidence.expire(before_ns)
            if not evidence.events:
                del processes[key]
        self._events_per_host[host] = sum(len(e.events) for e in processes.values())

    def _shed(self, host: str) -> None:
        """Over the count bound (a storm): drop the oldest tenth of the host's
        evidence in one go, so memory stays bounded whatever the rate."""
        before = self._events_per_host[host]
        lists = [e.starts for e in self._evidence[host].values() if e.starts]
        self._expire(host, _kth_smallest(lists, min(sum(map(len, lists)) - 1, before // 10)))
        self.evidence_evicted += before - self._events_per_host[host]

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- output ------------------------------------------------------------
    def due(self, now_ns: int) -> list[RequestAttribution]:
        """Attribute every request whose span ended at least grace_ns ago."""
        ready = [s for s in self._pending if s.end_ns + self.grace_ns <= now_ns]
        waiting = [s for s in self._pending if s.end_ns + self.grace_ns > now_ns]
        if len(waiting) > self.max_pending:  # memory bound: the oldest go now, with what evidence there is
            waiting.sort(key=lambda s: s.end_ns)
            ready.extend(waiting[:len(waiting) - self.max_pending])
            waiting = waiting[len(waiting) - self.max_pending:]
        if not ready:
            return []
        self._pending = waiting
        self._culprits = {}
        ready.sort(key=lambda s: s.end_ns)
        out = []
        try:
            for span in ready:
                key = (span.host, span.boot_id, span.seq)
                if key in self._attributed:  # the same span twice in the backlog
                    continue
                out.append(self.attribute(span))
                self._mark_attributed(span)
                self._attributed_until[span.host] = max(self._attributed_until.get(span.host, 0), span.end_ns)
        finally:
            self._splits.clear()  # evidence changes between calls (and ids are reused)
        return out

    def baseline_ns(self, host: str, name: str) -> tuple[int, bool]:
        """Rolling median of this host's requests of this name, each less its
        most-delayed thread's run-queue waits (``service_ns``: what it would
        have taken uncontended), and whether enough were seen to judge
        against it. Learning plain durations during a contention made the
        contention the normal: no excess left to explain."""
        samples = self._durations.get((host, name))
        if not samples:
            return 0, False
        return int(statistics.median(samples)), len(samples) >= self.min_samples

    def culprits(self, done: RequestAttribution) -> Culprits:
        """The throttled cgroup and the interrupt source behind a request of
        the last due() batch (empty when none was charged)."""
        return self._culprits.get((done.host, done.boot_id, done.seq), Culprits())

    def attribute(self, span: RequestSpan) -> RequestAttribution:
        """The span's record key (host, boot_id, seq) is reused, so attributing
        the same span again replaces, not adds, its row."""
        duration = max(0, span.end_ns - span.start_ns)
        baseline, trusted = self.baseline_ns(span.host, span.name)
        group = (self.processes.serving_group(span.host, span.pid) if self.processes and span.pid
                 else {span.pid} if span.pid else None)

        # Suspects are grouped by command name: a job of many processes (a
        # backup with workers, a pool of hogs) is one suspect to move; its pid
        # is the process that held the CPU longest.
        by_suspect: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        throttled = irq = 0
        throttles: dict[str, int] = defaultdict(int)
        sources: dict[tuple[int, str, str], int] = defaultdict(int)
        irq_records: dict[tuple[int, str, str], IrqTime] = {}
        contributed: set[int] = set()
        own_ns, own_threads = 0, set()  # held by the group's own threads
        parts = {kind: self._thread_parts(span, kind, group) for kind in (RunqEvent, GpuIoctl)}
        thread_waits: dict[tuple[int, int], int] = defaultdict(int)  # run-queue ns per thread
        for event, lo, hi, _whole in parts[RunqEvent]:
            thread_waits[(event.pid, event.tid)] += hi - lo
        budget = self._budget(span, group, thread_waits, contributed)
        if budget.named and budget.busy() and budget.delay_ns >= DOMINANT_SHARE * (duration - baseline):
            # The span names its thread, that thread was not mostly asleep
            # waiting on others, and its own waits and stalls would explain
            # the excess (else the request waited mostly on other threads of
            # the group: vLLM's front end asleep while its throttled engine
            # works): its own waits are the request's
            # delay, and those of the threads that held the GIL it waited
            # for, where they overlap its GIL waits: a holder kept off the CPU
            # (preempted, throttled) while it held the lock made it wait that
            # long. The GIL wait stays whole in the thread's budget; the
            # holders' waits inside it are candidates too, and the larger
            # names the cause (a quota that throttles the holder, not the GIL).
            own = {kind: [p for p in found if p[0].tid == budget.tid] for kind, found in parts.items()}
            held = [piece for p in parts[RunqEvent] if p[0].tid in budget.gil_holders
                    for piece in _within(p, budget.gil_spans)]
            own[RunqEvent] = sorted(own[RunqEvent] + held, key=lambda p: p[1])
            parts = own
        runq = ioctl = (0, 0, 0)
        longest_call: Evidence | None = None  # the longest GPU driver call: the one the alert names
        splits = self._splits
        for kind in (RunqEvent, GpuIoctl):
            total = longest = count = 0
            for event, lo, hi, whole in parts[kind]:
                part = hi - lo
                total += part
                if part > longest:
                    longest = part
                    if kind is GpuIoctl:
                        longest_call = event
                count += 1
                contributed.add(event.pid)
                if kind is not RunqEvent:
                    continue
                # a whole wait is split once per due(): the requests served together (continuous
                # batching) overlap the same waits, and each asks; the event stays in the evidence
                # (and its id its own) while due() runs
                split = splits.get(id(event)) if whole else None
                if split is None:
                    split = self._split(event, lo, hi)
                    if whole:
                        splits[id(event)] = split
                cut, cgroup, shares, stolen = split
                throttles[cgroup] += cut
                for key, ns, record in shares:
                    sources[key] += ns
                    irq_records[key] = record
                throttled += cut
                irq += stolen
                rest = part - cut - stolen
                if rest <= 0:
                    continue
                if group is not None and event.suspect_pid in group:
                    own_ns += rest
                    own_threads.add(event.suspect_tid)
                else:
                    by_suspect[event.suspect_comm][event.suspect_pid] += rest
            if kind is RunqEvent:
                runq = (total, longest, count)
            else:
                ioctl = (total, longest, count)
        # one thread cannot wait twice at once, so its waits are a lower bound
        # of the delay; other threads' waits may be off the request's path
        service = duration - min(duration, budget.delay_ns)
        self._durations[(span.host, span.name)].append(service)
        if not baseline:
            baseline = service
        excess = max(0, duration - baseline)
        ranked = sorted(by_suspect.items(), key=lambda item: -sum(item[1].values()))[:TOP_SUSPECTS]
        suspects = [Suspect(pid=max(pids, key=pids.get), comm=comm, wait_ns=sum(pids.values()))
                    for comm, pids in ranked]

        if excess < max(NO_EXCESS_NS, NO_EXCESS_SHARE * baseline):
            cause, explained = "none", 0.0
        else:
            # the cause that explains the most of the excess, if it explains enough. The group's
            # threads waiting at the same moment delay the request once: its run-queue parts
            # are weighed by how long any thread waited (their union), not by the sum of the
            # threads' waits (a model's 8 worker threads queued for the same 10 ms are 10 ms,
            # not 80, beside the 50 ms its front end waited for the GIL). One thread's waits
            # never overlap: for it the two are the same.
            waited = _union_ns(parts[RunqEvent])
            share = waited / runq[0] if runq[0] else 1.0
            name, ns = max((("runq_starvation", share * (runq[0] - throttled - irq - own_ns)),
                            ("cfs_throttling", share * throttled), ("irq", share * irq),
                            ("self_contention", share * own_ns), ("gpu_ioctl_stall", ioctl[0]),
                            *((STALLS[kind], budget.blocked.get(kind, 0)) for kind in STALLS)),
                           key=lambda c: c[1])
            explained = min(1.0, ns / excess)
            cause = name if explained >= DOMINANT_SHARE else "unexplained"
        slo = self.slo_ns or (int(self.slo_factor * baseline) if trusted else 0)
        if throttled or irq:
            self._culprits[(span.host, span.boot_id, span.seq)] = Culprits(
                throttle=self._latest_throttle(span.host, max(throttles, key=throttles.get), span.end_ns)
                if throttled else None,
                irq=irq_records[max(sources, key=sources.get)] if irq else None)
        info = self.processes.processes.get((span.host, span.pid)) if self.processes else None
        found = self._culprits.get((span.host, span.boot_id, span.seq), Culprits())
        culprit = {"runq_starvation": suspects[0].comm if suspects else "",
                   "cfs_throttling": found.throttle.cgroup if found.throttle else "",
                   "irq": found.irq.source if found.irq else "",
                   "gpu_ioctl_stall": ioctl_name(longest_call.request) if longest_call else "",
                   "memory_stall": self._evictor(span, group),
                   }.get(cause) or budget.wakers.get(kind_of(cause), "")
        return RequestAttribution(
            host=span.host, boot_id=span.boot_id, seq=span.seq, ts_ns=span.end_ns, request_id=span.request_id,
            trace_id=span.trace_id, name=span.name, pid=span.pid, start_ns=span.start_ns, end_ns=span.end_ns, duration_ns=duration, baseline_ns=baseline,
            excess_ns=excess, status=span.status, runq_wait_ns=runq[0], runq_wait_max_ns=runq[1],
            runq_waits=runq[2], suspects=suspects, cause=cause, explained=round(explained, 4),
            slo_ns=slo, slo_breached=bool(slo) and duration > slo,
            gpu_ioctl_ns=ioctl[0], gpu_ioctl_max_ns=ioctl[1], gpu_ioctls=ioctl[2],
            throttled_ns=throttled, irq_ns=irq, pids=sorted(contributed),
            pod=info.pod if info else "", namespace=info.namespace if info else "",
            container=info.container if info else "", self_wait_ns=own_ns, self_threads=len(own_threads),
            service_ns=service, gpu_ioctl_call=ioctl_name(longest_call.request) if longest_call else "",
            thread_tid=budget.tid, gil_wait_ns=budget.blocked.get("gil", 0),
            memory_wait_ns=budget.blocked.get("memory", 0), io_wait_ns=budget.blocked.get("io", 0),
            sleep_ns=budget.blocked.get("sleep", 0), on_cpu_ns=budget.on_cpu_ns(duration), culprit=culprit,
        )

    def _budget(self, span: RequestSpan, group: set[int] | None, runq_waits: dict[tuple[int, int], int],
                contributed: set[int]) -> _Budget:
        """The time budget of the thread that carried the request: the span's
        ``thread.id`` where the group's evidence knows that thread, else the
        thread that lost the most to run-queue waits and stalls (a request
        waits on the thread that serves it; a thread's own waits cannot
        overlap, so its loss is a lower bound of the request's delay)."""
        blocked: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        wakers: dict[tuple[tuple[int, int], str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        holders: dict[tuple[int, int], set[int]] = defaultdict(set)
        gil_spans: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for event, lo, hi, _whole in self._thread_parts(span, BlockedWait, group):
            thread = (event.pid, event.tid)
            blocked[thread][event.kind] += hi - lo
            waker_pid, waker_tid, waker_comm = event.waker_pid, event.waker_tid, event.waker_comm
            if event.kind == "gil":
                gil_spans[thread].append((lo, hi))
                if not (waker_pid == event.pid and waker_tid != event.tid):  # woken by its wait's timeout
                    taker = self._gil_taker(span.host, event)
                    if taker:
                        waker_pid, waker_tid, waker_comm = taker.pid, taker.tid, taker.comm
                if waker_pid == event.pid and waker_tid != event.tid:
                    holders[thread].add(waker_tid)
            if waker_tid != event.tid:  # a thread woken by itself (its own timer, as it slept) names no one
                waker = f"{waker_comm}[{waker_tid}]" if waker_pid else "interrupt"
                wakers[(thread, event.kind)][waker] += hi - lo
            contributed.add(event.pid)
        lost = {thread: runq_waits.get(thread, 0) + sum(blocked[thread].get(k, 0) for k in STALLS)
                for thread in runq_waits.keys() | blocked.keys()}
        named = [thread for thread in lost if thread[1] == span.tid] if span.tid else []
        carrier = named[0] if named else max(lost, key=lost.get, default=None)
        if carrier is None:
            return _Budget()
        return _Budget(tid=carrier[1], named=bool(named), runq_ns=runq_waits.get(carrier, 0),
                       blocked=dict(blocked.get(carrier, {})),
                       wakers={kind: max(by, key=by.get) for (thread, kind), by in wakers.items() if thread == carrier},
                       gil_holders=holders.get(carrier, set()), gil_spans=sorted(gil_spans.get(carrier, [])))

    def _gil_taker(self, host: str, wait: BlockedWait) -> BlockedWait | None:
        """The GIL wait of the thread that last took the GIL from ``wait``'s
        thread, just before ``wait`` began: the holder during a GIL wait
        that ended by its timeout. (The holder's drop can beat the waiter
        back to sleep: its signal then wakes no one, and the waiter takes
        the GIL without another wait -- ~10% of the waits beside a hog on
        another CPU.) The hand-off is seen as the taker's own GIL wait,
        woken by ``wait``'s thread; None when the taker did not wait long
        enough to be recorded, or the hand-off was too long before."""
        evidence = self._evidence.get(host, {}).get((wait.pid, BlockedWait))
        if evidence is None:
            return None
        began = wait.ts_ns - wait.blocked_ns
        first, last = evidence.overlapping_range(began - GIL_HANDOFF_NS, began + GIL_HANDOFF_SLACK_NS)
        taken = [event for event in evidence.events[first:last]
                 if event.kind == "gil" and event.tid != wait.tid and event.waker_pid == wait.pid
                 and event.waker_tid == wait.tid and began - GIL_HANDOFF_NS <= event.ts_ns <= began + GIL_HANDOFF_SLACK_NS]
        return max(taken, key=lambda event: event.ts_ns, default=None)

    def _thread_parts(self, span: RequestSpan, kind: type,
                      group: set[int] | None) -> list[tuple[Evidence, int, int, bool]]:
        """(event, start, end, whether that is the whole event) of each part
        of ``kind`` evidence inside the request, from the processes of
        ``group`` (None: every process of the host), each thread's time
        counted once: one thread cannot wait twice at the same moment, so an
        overlap is a duplicate (a redelivered or re-primed event) and is dropped."""
        processes = self._evidence.get(span.host, {})
        if group is None:
            sources = [e for (_, k), e in processes.items() if k is kind]
        else:
            sources = [processes[(pid, kind)] for pid in group if (pid, kind) in processes]
        parts = []
        start_ns, end_ns = span.start_ns, span.end_ns
        for evidence in sources:
            first, last = evidence.overlapping_range(start_ns, end_ns)
            for begin, event in zip(evidence.starts[first:last], evidence.events[first:last]):
                finish = event.ts_ns
                lo = begin if begin > start_ns else start_ns
                hi = finish if finish < end_ns else end_ns
                if hi > lo:
                    parts.append((event.pid, event.tid, lo, hi, event, lo == begin and hi == finish))
        parts.sort(key=_THREAD_ORDER)
        out = []
        thread, covered = None, 0
        for pid, tid, lo, hi, event, whole in parts:
            if (pid, tid) != thread:
                thread, covered = (pid, tid), 0
            if lo < covered:
                lo, whole = covered, False
            if hi > lo:
                out.append((event, lo, hi, whole))
                covered = hi
        return out

    def _split(self, event: RunqEvent, lo: int, hi: int) -> tuple[int, str, list[tuple[tuple, int, IrqTime]], int]:
        """A wait's part [lo, hi] split by what kept the CPU away: (throttled
        ns, the cgroup charged, interrupt ns per source with its latest
        record, interrupt ns in all); the rest was the suspects'."""
        cut, cgroup = self._throttled(event, lo, hi)
        on_cpu = self._irq(event.host, event.cpu, lo, hi)
        spent = sum(ns for ns, _ in on_cpu.values())
        scale = min(1.0, (hi - lo - cut) / spent) if spent else 0.0  # at most what the wait has left
        return (cut, cgroup, [(key, int(ns * scale), record) for key, (ns, record) in on_cpu.items()],
                int(spent * scale))

    def _throttled(self, event: RunqEvent, lo: int, hi: int) -> tuple[int, str]:
        """How much of a wait's part [lo, hi] its cgroup (or an ancestor) was
        throttled, and which cgroup: the one that explains the most."""
        info = self.processes.processes.get((event.host, event.pid)) if self.processes else None
        if not info or not info.cgroup:
            return 0, ""
        processes = self._evidence.get(event.host, {})
        best, which = 0, ""
        for path in _ancestors(info.cgroup):
            evidence = processes.get((path, CgroupThrottle))
            if evidence is None:
                continue
            ns = 0
            for record in evidence.overlapping(lo, hi):
                part = overlap_ns(record, lo, hi)
                ns += part if event.suspect_pid == 0 else min(part, record.throttled_ns * part // record.interval_ns)
            if ns > best:
                best, which = ns, path
        return min(best, hi - lo), which

    def _irq(self, host: str, cpu: int, lo: int, hi: int) -> dict[tuple[int, str, str], tuple[int, IrqTime]]:
        """Interrupt time on ``cpu`` during [lo, hi] per source, prorated
        from the overlapping intervals: (cpu, kind, source) -> (ns, the
        latest record of that source)."""
        evidence = self._evidence.get(host, {}).get((cpu, IrqTime))
        out: dict[tuple[int, str, str], tuple[int, IrqTime]] = {}
        for record in evidence.overlapping(lo, hi) if evidence else ():
            part = overlap_ns(record, lo, hi)
            if part > 0:
                key = (record.cpu, record.kind, record.source)
                before = out.get(key, (0, record))[0]
                out[key] = (before + record.time_ns * part // record.interval_ns, record)
        return out

    def _evictor(self, span: RequestSpan, group: set[int] | None) -> str:
        """Who filled memory before a memory stall: the process outside the
        serving group that added the most pages (page cache and allocations,
        the pages probe's counts) from EVICTOR_LOOKBACK_NS before the request
        to its end, as "comm (pid N)"; "" when none is known. Among the
        processes under the same memory limit when any is (their process
        records' memory cgroups), else host-wide: the pages probe does not
        say which cgroup a page was charged to."""
        evidence = self._evidence.get(span.host, {}).get((HOST_PAGES, PagePlacement))
        added: dict[int, int] = defaultdict(int)
        names: dict[int, str] = {}
        for record in evidence.overlapping(span.start_ns - EVICTOR_LOOKBACK_NS, span.end_ns) if evidence else ():
            if record.pid and (group is None or record.pid not in group):
                added[record.pid] += record.page_cache_pages + record.alloc_pages
                names[record.pid] = record.comm
        limit = self._memory_limit(span.host, span.pid)
        if limit:
            # under a limit: those sharing it, else those not known to be charged elsewhere -- a
            # process whose record puts it outside the stalled one's limit did not fill it (the disk
            # reader of an earlier pod, say)
            records = {pid: self._record(span.host, pid) for pid in added}
            sharing = [pid for pid, record in records.items() if record and shares_limit(limit, record.memory_cgroup)]
            candidates = sharing or [pid for pid, record in records.items() if record is None]
            if candidates:
                added = {pid: added[pid] for pid in candidates}
        if not added:
            return ""
        pid = max(added, key=added.get)
        return f"{names[pid]} (pid {pid})"

    def _record(self, host: str, pid: int) -> ProcessInfo | None:
        """The process's record, or None where none has come (yet)."""
        return self.processes.processes.get((host, pid)) if self.processes else None

    def _memory_limit(self, host: str, pid: int) -> str:
        """The memory cgroup the process is limited by, "" when none is known (the root is no limit)."""
        record = self._record(host, pid)
        return record.memory_cgroup if record and record.memory_cgroup not in ("", "/") else ""

    def _latest_throttle(self, host: str, cgroup: str, before_ns: int) -> CgroupThrottle | None:
        """The cgroup's latest throttled interval up to the request's end (its limit as it was)."""
        evidence = self._evidence.get(host, {}).get((cgroup, CgroupThrottle))
        if not evidence:
            return None
        earlier = [r for r in evidence.events if r.ts_ns - r.interval_ns <= before_ns]
        return max(earlier or evidence.events, key=lambda r: r.ts_ns)
