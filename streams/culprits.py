# SPDX-License-Identifier: Apache-2.0
"""Whom and what a request's lost time is charged to, searched in one host's
evidence (streams/evidence.py). Pure logic, no I/O; streams/attribution.py
asks, per request:

- ``split_wait``: a run-queue wait split by what kept the CPU away: the
  throttled part and its cgroup (``throttled``), interrupt time per source
  (``irq_by_source``); the rest is the suspects';
- ``latest_throttle``: the throttled interval a remedy names (``Culprits``);
- ``gil_taker``: the GIL holder behind a GIL wait that ended by its timeout;
- ``evictor``: who filled memory before a memory stall, among the processes
  under the stalled one's memory limit (``memory_limit``, ``shares_limit``);
- ``CulpritStacks``: what the top neighbour ran while it held the CPU.
"""

from __future__ import annotations

import functools
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Callable

from jitterscope.schemas.events import (BlockedWait, CgroupThrottle, IrqTime, PagePlacement, ProcessInfo, RequestSpan,
                                        RunqEvent, StackTrace)
from jitterscope.streams.evidence import HOST_PAGES, HostEvidence, SortedEvidence, overlap_ns
from jitterscope.streams.throttle_index import throttled_span

#: how far before a memory stall to look for who filled memory: an archiver
#: that buffered its logs a while ago still holds what it took
EVICTOR_LOOKBACK_NS = 60_000_000_000
# A GIL wait woken by its timeout is charged to the thread that took the GIL
# from the waiter at most this long before the wait began (a switch interval:
# a thread asked to drop the GIL asks for it back at once) ...
GIL_HANDOFF_NS = 5_000_000
# ... or this long after (a merged wait's start, ts - blocked_ns, is late by
# the moments on the CPU between its parts)
GIL_HANDOFF_SLACK_NS = 1_000_000


@dataclass(frozen=True)
class Culprits:
    """The records behind a request's throttling and interrupt charges, for
    a remedy that names the limit or the interrupt (None: none charged)."""

    throttle: CgroupThrottle | None = None  # the latest interval of the cgroup charged most
    irq: IrqTime | None = None  # the interrupt source charged most, with its CPU


@functools.lru_cache(maxsize=65536)  # asked for every wait a request overlaps; a host has few cgroups
def cgroup_ancestors(cgroup: str) -> tuple[str, ...]:
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


def split_wait(evidence: HostEvidence, info: ProcessInfo | None, event: RunqEvent, lo: int,
               hi: int) -> tuple[int, str, list[tuple[tuple, int, IrqTime]], int]:
    """A wait's part [lo, hi] split by what kept the CPU away: (throttled
    ns, the cgroup charged, interrupt ns per source with its latest
    record, interrupt ns in all); the rest was the suspects'. ``info``:
    the waiting process's record."""
    cut, cgroup = throttled(evidence, info, event, lo, hi)
    on_cpu = irq_by_source(evidence, event.cpu, lo, hi)
    spent = sum(ns for ns, _ in on_cpu.values())
    scale = min(1.0, (hi - lo - cut) / spent) if spent else 0.0  # at most what the wait has left
    return (cut, cgroup, [(key, int(ns * scale), record) for key, (ns, record) in on_cpu.items()],
            int(spent * scale))


def throttled(evidence: HostEvidence, info: ProcessInfo | None, event: RunqEvent, lo: int, hi: int) -> tuple[int, str]:
    """How much of a wait's part [lo, hi] its cgroup (or an ancestor) was
    throttled, and which cgroup: the one that explains the most. ``info``:
    the waiting process's record. When the idle task ran next, nothing but
    the quota held the thread back: every overlapping interval counts in
    full, from when its throttled time can have begun (``throttled_span``,
    as the run-queue rule counts it); else each record's throttled time is
    spread over its interval."""
    if not info or not info.cgroup:
        return 0, ""
    best, which = 0, ""
    idle_next = event.suspect_pid == 0
    for path in cgroup_ancestors(info.cgroup):
        found = evidence.get((path, CgroupThrottle))
        if not found or not found.events:
            continue
        ns = 0
        reach = found.events[-1].period_us * 1000 if idle_next else 0  # a span begins up to a period early
        for record in found.overlapping(lo, hi + reach):
            if idle_next:
                begin, end = throttled_span(record)
                ns += max(0, min(hi, end) - max(lo, begin))
            else:
                part = overlap_ns(record, lo, hi)
                ns += min(part, record.throttled_ns * part // record.interval_ns)
        if ns > best:
            best, which = ns, path
    return min(best, hi - lo), which


def irq_by_source(evidence: HostEvidence, cpu: int, lo: int,
                  hi: int) -> dict[tuple[int, str, str], tuple[int, IrqTime]]:
    """Interrupt time on ``cpu`` during [lo, hi] per source, prorated
    from the overlapping intervals: (cpu, kind, source) -> (ns, the
    latest record of that source)."""
    found = evidence.get((cpu, IrqTime))
    out: dict[tuple[int, str, str], tuple[int, IrqTime]] = {}
    for record in found.overlapping(lo, hi) if found else ():
        part = overlap_ns(record, lo, hi)
        if part > 0:
            key = (record.cpu, record.kind, record.source)
            before = out.get(key, (0, record))[0]
            out[key] = (before + record.time_ns * part // record.interval_ns, record)
    return out


def latest_throttle(evidence: HostEvidence, cgroup: str, before_ns: int) -> CgroupThrottle | None:
    """The cgroup's latest throttled interval up to the request's end (its limit as it was)."""
    found = evidence.get((cgroup, CgroupThrottle))
    if not found:
        return None
    earlier = [r for r in found.events if r.ts_ns - r.interval_ns <= before_ns]
    return max(earlier or found.events, key=lambda r: r.ts_ns)


def gil_taker(evidence: HostEvidence, wait: BlockedWait) -> BlockedWait | None:
    """The GIL wait of the thread that last took the GIL from ``wait``'s
    thread, just before ``wait`` began: the holder during a GIL wait
    that ended by its timeout. (The holder's drop can beat the waiter
    back to sleep: its signal then wakes no one, and the waiter takes
    the GIL without another wait -- ~10% of the waits beside a hog on
    another CPU.) The hand-off is seen as the taker's own GIL wait,
    woken by ``wait``'s thread; None when the taker did not wait long
    enough to be recorded, or the hand-off was too long before."""
    found = evidence.get((wait.pid, BlockedWait))
    if found is None:
        return None
    began = wait.ts_ns - wait.blocked_ns
    first, last = found.overlapping_range(began - GIL_HANDOFF_NS, began + GIL_HANDOFF_SLACK_NS)
    taken = [event for event in found.events[first:last]
             if event.kind == "gil" and event.tid != wait.tid and event.waker_pid == wait.pid
             and event.waker_tid == wait.tid and began - GIL_HANDOFF_NS <= event.ts_ns <= began + GIL_HANDOFF_SLACK_NS]
    return max(taken, key=lambda event: event.ts_ns, default=None)


def memory_limit(record: ProcessInfo | None) -> str:
    """The memory cgroup the process is limited by, "" when none is known (the root is no limit)."""
    return record.memory_cgroup if record and record.memory_cgroup not in ("", "/") else ""


def evictor(evidence: HostEvidence, span: RequestSpan, group: set[int] | None,
            record_of: Callable[[int], ProcessInfo | None]) -> str:
    """Who filled memory before a memory stall: the process outside the
    serving group that added the most pages (page cache and allocations,
    the pages probe's counts) from EVICTOR_LOOKBACK_NS before the request
    to its end, as "comm (pid N)"; "" when none is known. Among the
    processes under the same memory limit when any is (memcg reclaim takes
    from the cgroup whatever the node), else on the NUMA nodes where the
    serving group's own pages landed (a node's reclaim takes from that
    node: the archiver that filled node 1 did not evict weights on node 0),
    else host-wide. A process's memory cgroup is the one its page counts
    carry (the collector reads it with them), else its process record's:
    that travels on another topic and may come late, or never for a
    short-lived process. ``record_of``: a pid's process record on the
    span's host, None where none has come (yet). A process that exited
    before the request began holds none of its allocations (the archiver of
    an earlier cron run): only the page cache it added counts."""
    found = evidence.get((HOST_PAGES, PagePlacement))
    added: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # pid -> node -> pages
    allocated: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # pid -> node -> allocations
    exited: set[int] = set()
    names: dict[int, str] = {}
    cgroups: dict[int, str] = {}
    serving_nodes: set[int] = set()
    for record in found.overlapping(span.start_ns - EVICTOR_LOOKBACK_NS, span.end_ns) if found else ():
        if record.pid == span.pid or (group is not None and record.pid in group):
            serving_nodes.add(record.node)
        elif record.pid:
            added[record.pid][record.node] += record.page_cache_pages + record.alloc_pages
            allocated[record.pid][record.node] += record.alloc_pages
            names[record.pid] = record.comm
            cgroups[record.pid] = record.memory_cgroup or cgroups.get(record.pid, "")
            if record.exited and record.ts_ns <= span.start_ns:
                exited.add(record.pid)
    for pid in exited:
        for node, pages in allocated[pid].items():
            added[pid][node] -= pages
    limit = memory_limit(record_of(span.pid))
    if limit:
        for pid in added:
            if not cgroups[pid]:
                cgroups[pid] = getattr(record_of(pid), "memory_cgroup", None) or ""
        # under a limit: those sharing it, else those whose cgroup is not known -- a process
        # known to be charged elsewhere did not fill it (the disk reader of an earlier pod, say)
        sharing = [pid for pid in added if shares_limit(limit, cgroups[pid])]
        candidates = sharing or [pid for pid in added if not cgroups[pid]]
        if not candidates:  # every filler seen is charged elsewhere (the evictor's own counts not in yet)
            return ""
    else:
        candidates = [pid for pid in added if serving_nodes & added[pid].keys()] if serving_nodes else []
        added = {pid: {node: pages for node, pages in nodes.items() if node in serving_nodes}
                 for pid, nodes in added.items()} if candidates else added
    totals = {pid: total for pid in (candidates or added) if (total := sum(added[pid].values())) > 0}
    if not totals:
        return ""
    pid = max(totals, key=totals.__getitem__)
    # by the newest name it has been seen with: a process counted in its first moments may still have
    # its parent's (an interpreter before its prctl, a fork before its exec)
    newest = next((r.comm for r in reversed(found.events if found else []) if r.pid == pid and r.comm), names[pid])
    return f"{newest} (pid {pid})"


class CulpritStacks:
    """Where a culprit's stack comes from: the run-queue waits that carry one
    (the probe takes stacks only for waits worth an alert: few), per host
    and in the evidence's window, and the stacks the collectors sent (each
    once, before the first wait that names it; an id is a hash of the
    frames, the same on every host), the last ``size`` kept: what an
    attribution's culprit_stack resolves to when it is exported
    (streams/otlp_export.py). Kept apart from the evidence so that looking
    one up never walks a request's every wait."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._waits: dict[str, SortedEvidence] = defaultdict(SortedEvidence)
        self._stacks: OrderedDict[int, StackTrace] = OrderedDict()

    def saw(self, wait: RunqEvent) -> None:
        """A run-queue wait with a suspect stack (the caller checks: the bulk has none)."""
        self._waits[wait.host].add(wait, wait.wait_ns)

    def expire(self, host: str, before_ns: int) -> None:
        if host in self._waits:
            self._waits[host].expire(before_ns)

    def forget(self, host: str) -> None:
        self._waits.pop(host, None)

    def culprit_stack(self, span: RequestSpan, group: set[int] | None, comm: str) -> int:
        """The stack (StackTrace.stack_id) a neighbour named ``comm`` ran while
        it held the CPU of the request's longest wait behind it, among the
        waits of its serving group (None: of the host); 0 where none was
        captured."""
        longest, stack, found = 0, 0, self._waits.get(span.host)
        for event in found.overlapping(span.start_ns, span.end_ns) if found else ():
            if event.suspect_comm == comm and (group is None or event.pid in group) and (
                    part := overlap_ns(event, span.start_ns, span.end_ns)) > longest:
                longest, stack = part, event.suspect_stack
        return stack

    def add(self, records: list[StackTrace]) -> None:
        for record in records:
            self._stacks[record.stack_id] = record
            self._stacks.move_to_end(record.stack_id)
        while len(self._stacks) > self.size:
            self._stacks.popitem(last=False)

    def get(self, stack_id: int) -> StackTrace | None:
        return self._stacks.get(stack_id) if stack_id else None
