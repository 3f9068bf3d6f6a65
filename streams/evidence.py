# SPDX-License-Identifier: Apache-2.0
"""The kernel evidence request attribution keeps, and the interval
arithmetic over it. Pure logic, no I/O.

A host's evidence (``HostEvidence``) is one ``SortedEvidence`` per key and
kind: the process for a thread's evidence (run-queue waits, GPU driver
calls, blocked waits), the cgroup for throttling, the CPU for interrupts,
HOST_PAGES for page placements (``index_of``). streams/attribution.py fills
and expires it and cuts each request's parts out of it (``thread_parts``),
as streams/thread_budget.py does for the carrying thread's blocked waits;
streams/culprits.py searches it for whom to name.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field
from typing import Any

from jitterscope.schemas.events import BlockedWait, CgroupThrottle, GpuIoctl, IrqTime, PagePlacement, RunqEvent

Evidence = RunqEvent | GpuIoctl | CgroupThrottle | IrqTime | BlockedWait | PagePlacement
#: one piece of a record inside a window: (the record, its start and end there, whether that is all of it). The
#: record is of the kind the caller asked for (a key's kind, chosen at run time): typed Any, not the union
Part = tuple[Any, int, int, bool]

#: the key of a host's page placements (one list: the evictor is looked for host-wide)
HOST_PAGES = "pages"
MAX_WAITS_PER_PROCESS = 200_000  # memory bound per process, whatever the horizon
#: holder command name -> a number, for SortedEvidence.columns: the names a host's tasks take are few,
#: and comparing numbers in arrays is what makes a batch's suspects cheap
COMM_IDS: dict[str, int] = {}
_THREAD_ORDER = operator.itemgetter(0, 1, 2)  # a part's (pid, tid, start): one thread's parts in time order


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


def index_of(event: Evidence) -> int | str:
    """What evidence of its kind is looked up by: the process for a
    thread's evidence, the cgroup for throttling, the CPU for interrupts."""
    if isinstance(event, CgroupThrottle):
        return event.cgroup
    if isinstance(event, IrqTime):
        return event.cpu
    if isinstance(event, PagePlacement):
        return HOST_PAGES
    return event.pid


def overlap_ns(event: Evidence, start_ns: int, end_ns: int) -> int:
    """How much of the event's [ts - duration, ts] lies inside [start, end]."""
    return max(0, min(end_ns, event.ts_ns) - max(start_ns, event.ts_ns - duration_ns(event)))


def within(part: tuple, spans: list[tuple[int, int]]) -> list[tuple]:
    """The pieces of a (event, lo, hi, whole) part inside ``spans`` (sorted,
    not overlapping), each a part of its own (no longer whole)."""
    event, lo, hi, _whole = part
    return [(event, max(lo, a), min(hi, b), False) for a, b in spans if a < hi and b > lo]


def union_ns(parts: list[Part]) -> int:
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


def kth_smallest(lists: list[list[int]], k: int) -> int:
    """The k-th smallest (from 0) of the values of sorted lists, as sorting
    them all would give, by bisecting the value range: O(log range x lists
    x log n), not O(n log n) -- a storm sheds every few thousand events."""
    lo, hi = min(values[0] for values in lists), max(values[-1] for values in lists)
    while lo < hi:  # the smallest value with more than k values at or below it
        mid = (lo + hi) // 2
        if sum(bisect.bisect_right(values, mid) for values in lists) > k:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class SortedEvidence:
    """One process's recent evidence of one kind, sorted by start."""

    starts: list[int] = field(default_factory=list)  # ts - duration, sorted
    events: list[Any] = field(default_factory=list)  # in the same order; all of one kind (Evidence), the key's
    longest_ns: int = 0  # longest one kept: how far before a request to look
    # run-queue waits only, read as arrays by a due() batch (streams/wait_columns.py): per column
    # (ends, tids, CPUs, holder pids, holder tids, holder comms as COMM_IDS) the values of
    # events[:len(column)], filled in by columns() as they are asked for, not as events come
    cols: tuple[list[int], ...] | None = None

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
            self._forget_columns(index, None)
        self.longest_ns = max(self.longest_ns, length)
        if len(self.events) > MAX_WAITS_PER_PROCESS:
            drop = MAX_WAITS_PER_PROCESS // 10  # the oldest tenth, in one go
            del self.starts[:drop]
            del self.events[:drop]
            self._forget_columns(None, drop)

    def expire(self, before_ns: int) -> None:
        cut = bisect.bisect_left(self.starts, before_ns)
        if cut:
            del self.starts[:cut]
            del self.events[:cut]
            self._forget_columns(None, cut)

    def _forget_columns(self, after: int | None, before: int | None) -> None:
        """Drop the columns' values from ``after`` on (an event inserted there) or before ``before`` (expired)."""
        for column in self.cols or ():
            del column[after:before]

    def columns(self) -> tuple[list[int], ...]:
        """The run-queue waits' columns (see ``cols``), brought up to date."""
        if self.cols is None:
            self.cols = ([], [], [], [], [], [])
        ends, tids, cpus, pids, holders, comms = self.cols
        new = self.events[len(ends):]
        if new:
            ends += [e.ts_ns for e in new]
            tids += [e.tid for e in new]
            cpus += [e.cpu for e in new]
            pids += [e.suspect_pid for e in new]
            holders += [e.suspect_tid for e in new]
            comms += [COMM_IDS.setdefault(e.suspect_comm, len(COMM_IDS)) for e in new]
        return self.cols

    def overlapping_range(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """The index range of the events that may overlap [start, end]."""
        return (bisect.bisect_left(self.starts, start_ns - self.longest_ns),
                bisect.bisect_right(self.starts, end_ns))

    def overlapping(self, start_ns: int, end_ns: int) -> list[Any]:
        first, last = self.overlapping_range(start_ns, end_ns)
        return self.events[first:last]


#: one host's evidence: (pid | cgroup | cpu | HOST_PAGES, kind) -> its events
HostEvidence = dict[tuple[int | str, type], SortedEvidence]


def thread_parts(evidence: HostEvidence, start_ns: int, end_ns: int, kind: type,
                 group: set[int] | None) -> list[Part]:
    """(event, start, end, whether that is the whole event) of each part
    of ``kind`` evidence inside [start_ns, end_ns] (a request), from the
    processes of ``group`` (None: every process of the host), each
    thread's time counted once: one thread cannot wait twice at the same
    moment, so an overlap is a duplicate (a redelivered or re-primed
    event) and is dropped."""
    if group is None:
        sources = [e for (_, k), e in evidence.items() if k is kind]
    else:
        sources = [evidence[(pid, kind)] for pid in group if (pid, kind) in evidence]
    parts = []
    for found in sources:
        first, last = found.overlapping_range(start_ns, end_ns)
        for begin, event in zip(found.starts[first:last], found.events[first:last]):
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


def add_calls(parts: list[Part],
              contributed: set[int]) -> tuple[tuple[int, int, int], GpuIoctl | None]:
    """A request's GPU driver call parts added up: (ns in all, the longest,
    how many), and the longest call (the one the alert names)."""
    total = longest = count = 0
    longest_call = None
    for event, lo, hi, _whole in parts:
        part = hi - lo
        total += part
        if part > longest:
            longest = part
            longest_call = event
        count += 1
        contributed.add(event.pid)
    return (total, longest, count), longest_call
