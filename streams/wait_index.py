# SPDX-License-Identifier: Apache-2.0
"""A serving group's run-queue waits indexed for one due() batch, so a
request's run-queue charges cost O((threads + keys) log n) plus its edge
waits, not a walk of every wait inside its window. Pure logic, no I/O;
streams/attribution.py builds one per (host, serving group) of a due()
batch over the span of the batch's windows (``WaitIndex.build``) and asks
it per request (``WaitIndex.charges``); the evidence is
streams/evidence.py's, the splits streams/culprits.py's ``split_wait``.

Why per batch: a wait's split (throttled, interrupt and suspect shares)
depends on throttling and interrupt records that may arrive after it, so
it is computed at due() time, as the walk it replaces did. The batch's
build costs O(n log n) for the n waits its windows overlap (each split
once, as before); every request of the batch then asks in O(log n) per
thread and per key, however many waits its window holds.

The structure:

- per thread (pid, tid), its waits in time order (a thread's waits never
  overlap: one cannot wait twice at once) with their starts, ends, prefix
  sums of their lengths and a sparse table of their lengths (range max in
  O(1)). Two bisects find the waits a window [S, E] overlaps; only the
  first (when it starts before S) and the last (when it ends after E) are
  clipped: those are the request's edge parts, split on their clipped
  part. The thread's total, count and longest inside come from the sums
  and the table: the thread budget (streams/thread_budget.py) needs every
  thread's total.
- per key of a split (throttled cgroup, interrupt source, suspect (comm,
  pid), the group's own holder threads, ...), over the group's waits in
  end order, the positions of the waits that charge it and the prefix sums
  of what they charge. The waits whole inside [S, E] are those ending in
  (S, E] less the ones that start before S (edge parts, known from the
  threads): a key's sum over a window is two bisects, less those edge
  waits' whole shares, plus every edge part's clipped share. This is what
  makes prefix sums exact at the window's edges.
- the union of the group's waits as disjoint intervals with prefix sums of
  their lengths: how long any thread waited in [S, E], in O(log n).

Exactness: the walk added parts in (pid, tid, start) order, and where two
keys tie for the largest charge its dicts kept the first inserted; the
index finds that key by scanning the window's parts in the walk's order up
to the first tied one (``_first_seen``), and the interrupt record the walk
kept by scanning back from the last (``_latest_record``). A batch where
some thread's waits overlap (redelivered or re-primed events, which the
walk trims) is not indexed: its requests walk. tests/unit/streams/
test_wait_index.py holds the index to the walk's answers.

``SplitCache`` keeps whole waits' splits from one batch to the next until
evidence they depend on arrives, changes or expires.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Callable, Sequence

from jitterscope.schemas.events import IrqTime, RunqEvent, Suspect
from jitterscope.streams.evidence import HostEvidence

TOP_SUSPECTS = 3  # suspects a request names
#: a wait's (or part's) split, as streams/culprits.py's split_wait gives it
Split = tuple[int, str, list[tuple[tuple, int, IrqTime]], int]


class Tie(Exception):
    """Two keys share the largest charge: only the walk's order says which it names."""


@dataclass
class Charged:
    """A request's run-queue charges: what streams/attribution.py's _Charges holds for its run-queue parts."""

    runq: tuple[int, int, int]
    suspects: list[Suspect]
    throttled: int
    throttles: dict[str, int]
    irq: int
    sources: dict[tuple, int]
    irq_records: dict[tuple, IrqTime]
    own_ns: int
    own_threads: set[int]
    idle_ns: int
    pids: set[int] = field(default_factory=set)


class _Thread:
    """One thread's waits in the batch's span, in time order."""

    __slots__ = ("begins", "ends", "events", "sums", "table")

    def __init__(self, waits: list[tuple[int, RunqEvent]]):
        self.begins = [begin for begin, _ in waits]
        self.ends = [event.ts_ns for _, event in waits]
        self.events = [event for _, event in waits]
        lengths = [end - begin for begin, end in zip(self.begins, self.ends)]
        self.sums = [0, *accumulate(lengths)]
        self.table = [lengths]  # table[k][i]: the longest of lengths[i:i + 2**k]
        while 2 ** len(self.table) <= len(lengths):
            row, half = self.table[-1], 2 ** (len(self.table) - 1)
            self.table.append([max(row[i], row[i + half]) for i in range(len(row) - half)])

    def longest(self, a: int, b: int) -> int:
        """The longest of waits a..b-1 (b > a)."""
        k = (b - a).bit_length() - 1
        row = self.table[k]
        return max(row[a], row[b - 2 ** k])


class WaitIndex:
    """One serving group's run-queue waits over one due() batch's span."""

    def __init__(self, threads: dict[tuple[int, int], _Thread], group: set[int] | None,
                 whole: Callable[[list[RunqEvent]], list[Split]]):
        self.threads = sorted(threads.items())  # the walk's (pid, tid) order
        self.group = group
        waits = sorted((event for _, t in self.threads for event in t.events), key=lambda e: e.ts_ns)
        self.ends = [event.ts_ns for event in waits]
        # id(wait) -> its whole split, while due() runs: all of them split at once (streams/split_columns.py)
        self.split = {id(event): split for event, split in zip(waits, whole(waits))}
        keyed: dict[tuple, tuple[list[int], list[int]]] = defaultdict(lambda: ([], [0]))
        for position, event in enumerate(waits):
            for key, value in self._shares(event, event.wait_ns, self.split[id(event)]):
                positions, sums = keyed[key]
                positions.append(position)
                sums.append(sums[-1] + value)
        self.keyed = dict(keyed)
        self.union_starts, self.union_ends = _merged(sorted((e.ts_ns - e.wait_ns, e.ts_ns) for e in waits))
        self.union_sums = [0, *accumulate(b - a for a, b in zip(self.union_starts, self.union_ends))]

    @classmethod
    def build(cls, evidence: HostEvidence, group: set[int] | None, lo_ns: int, hi_ns: int,
              whole: Callable[[list[RunqEvent]], list[Split]]) -> WaitIndex | None:
        """The index of the group's waits that overlap [lo_ns, hi_ns] (the
        batch's windows); None where some thread's waits overlap (the walk
        trims those). ``whole``: whole waits' splits."""
        if group is None:
            sources = [e for (_, k), e in evidence.items() if k is RunqEvent]
        else:
            sources = [evidence[(pid, RunqEvent)] for pid in group if (pid, RunqEvent) in evidence]
        by_thread: dict[tuple[int, int], list[tuple[int, RunqEvent]]] = defaultdict(list)
        for found in sources:
            first, last = found.overlapping_range(lo_ns, hi_ns)
            for begin, event in zip(found.starts[first:last], found.events[first:last]):
                if event.ts_ns > begin and event.ts_ns > lo_ns and begin < hi_ns:  # no part from an empty wait
                    waits = by_thread[(event.pid, event.tid)]
                    if waits and begin < waits[-1][1].ts_ns:
                        return None
                    waits.append((begin, event))
        return cls({thread: _Thread(waits) for thread, waits in by_thread.items()}, group, whole)

    def _shares(self, event: RunqEvent, part: int, split: Split) -> list[tuple[tuple, int]]:
        """What one part (``part`` ns of ``event``, split as ``split``) adds to each key, as the walk adds it."""
        cut, cgroup, shares, stolen = split
        out: list[tuple[tuple, int]] = [(("throttle", cgroup), cut), (("stolen",), stolen),
                                        *((("irq", key), ns) for key, ns, _ in shares)]
        rest = part - cut - stolen
        if rest > 0:
            if self.group is not None and event.suspect_pid in self.group:
                out += [(("own",), rest), (("own thread", event.suspect_tid), 1)]
            elif event.suspect_pid == 0:
                out.append((("idle",), rest))
            else:
                out.append((("suspect", event.suspect_comm, event.suspect_pid), rest))
        return out

    def union_ns(self, start_ns: int, end_ns: int) -> int:
        """How long at least one of the group's threads waited inside [start, end]."""
        a, b = bisect.bisect_right(self.union_ends, start_ns), bisect.bisect_left(self.union_starts, end_ns)
        if b <= a:
            return 0
        return (self.union_sums[b] - self.union_sums[a] - max(0, start_ns - self.union_starts[a])
                - max(0, self.union_ends[b - 1] - end_ns))

    def charges(self, start_ns: int, end_ns: int,
                edge: Callable[[RunqEvent, int, int], Split]) -> tuple[dict[tuple[int, int], int], Charged]:
        """Run-queue ns per thread (in the walk's order) and the charges of
        the window [start, end]; ``edge``: a clipped part's split. Raises Tie."""
        per_thread, edges, count, longest, pids, ranges = self._threads(start_ns, end_ns)
        totals: dict[tuple, int] = defaultdict(int)
        splits = {}
        for event, lo, hi, where in edges:
            if event.ts_ns - event.wait_ns < start_ns and event.ts_ns <= end_ns:  # counted below as whole: take it out
                for key, value in self._shares(event, event.wait_ns, self.split[id(event)]):
                    totals[key] -= value
            splits[where] = edge(event, lo, hi)
            for key, value in self._shares(event, hi - lo, splits[where]):
                totals[key] += value
        a, b = bisect.bisect_right(self.ends, start_ns), bisect.bisect_right(self.ends, end_ns)
        for key, (positions, sums) in self.keyed.items():
            i, j = bisect.bisect_left(positions, a), bisect.bisect_left(positions, b)
            if j > i:
                totals[key] += sums[j] - sums[i]
        charged = _charged(totals, (sum(per_thread.values()), longest, count), pids,
                           lambda wanted, enough: self._first_seen(start_ns, end_ns, ranges, splits, wanted, enough))
        if charged.irq:
            source = max(charged.sources, key=charged.sources.__getitem__)
            charged.irq_records = {source: self._latest_record(ranges, source, splits)}
        return per_thread, charged

    def _threads(self, start_ns: int, end_ns: int) -> tuple[dict, list, int, int, set[int], list]:
        """Per thread its total; the window's edge parts (event, lo, hi,
        (thread, index)); the parts' count, longest and pids; and each
        thread's range of waits in the window (thread, its waits, i, j)."""
        # a defaultdict as runq_per_thread's: thread_budget breaks a tie for the carrier in the
        # order of a set made from its keys, and CPython builds that set differently from a plain dict
        per_thread: dict[tuple[int, int], int] = defaultdict(int)
        edges, count, longest, pids, ranges = [], 0, 0, set(), []
        for thread, t in self.threads:
            i, j = bisect.bisect_right(t.ends, start_ns), bisect.bisect_left(t.begins, end_ns)
            if j <= i:
                continue
            first, last = t.begins[i] < start_ns, t.ends[j - 1] > end_ns
            total = t.sums[j] - t.sums[i]
            for k in ([i] if first else []) + ([j - 1] if last and not (first and j - 1 == i) else []):
                lo, hi = max(t.begins[k], start_ns), min(t.ends[k], end_ns)
                total -= (t.ends[k] - t.begins[k]) - (hi - lo)
                longest = max(longest, hi - lo)
                edges.append((t.events[k], lo, hi, (thread, k)))
            if j - last > i + first:
                longest = max(longest, t.longest(i + first, j - last))
            per_thread[thread] = total
            count += j - i
            pids.add(thread[0])
            ranges.append((thread, t, i, j))
        return per_thread, edges, count, longest, pids, ranges

    def parts(self, start_ns: int, end_ns: int, tids: set[int]) -> list[tuple[RunqEvent, int, int, bool]]:
        """The walk's parts (event, lo, hi, whole) of the threads ``tids`` (of any of the group's processes)."""
        out = []
        for (_pid, tid), t in self.threads:
            if tid in tids:
                for k in range(bisect.bisect_right(t.ends, start_ns), bisect.bisect_left(t.begins, end_ns)):
                    lo, hi = max(t.begins[k], start_ns), min(t.ends[k], end_ns)
                    out.append((t.events[k], lo, hi, lo == t.begins[k] and hi == t.ends[k]))
        return out

    def _first_seen(self, start_ns: int, end_ns: int, ranges: list, splits: dict, wanted: set[tuple],
                    enough: int) -> dict[tuple, int]:
        """The order in which the walk first charged the ``wanted`` keys (all
        of one kind), up to the first ``enough`` of them: it breaks ties as
        the walk's dicts did (the first inserted)."""
        seen: dict[tuple, int] = {}
        kind = next(iter(wanted))[0]
        for thread, t, i, j in ranges:
            for k in range(i, j):
                event = t.events[k]
                split = splits.get((thread, k)) or self.split[id(event)]
                if kind == "irq":  # the common tie (sources of equal shares): no need for every share
                    keys = [("irq", key) for key, _ns, _record in split[2]]
                elif kind == "throttle":
                    keys = [("throttle", split[1])]
                else:
                    part = min(t.ends[k], end_ns) - max(t.begins[k], start_ns)
                    keys = [key for key, _value in self._shares(event, part, split)]
                for key in keys:
                    if key in wanted and key not in seen:
                        seen[key] = len(seen)
                        if len(seen) == enough:
                            return seen
        return seen

    def _latest_record(self, ranges: list, source: tuple, splits: dict) -> IrqTime:
        """The record the walk kept for an interrupt source: its record in
        the last part, in (pid, tid, start) order, whose split names it."""
        for thread, t, i, j in reversed(ranges):
            for k in range(j - 1, i - 1, -1):
                split = splits.get((thread, k)) or self.split[id(t.events[k])]
                for key, _ns, record in split[2]:
                    if key == source:
                        return record
        raise Tie  # not reached: a source with a charge was named by some part


def rank_suspects(by_suspect: dict[str, dict[int, int]], top: int) -> list[Suspect]:
    """The ``top`` suspects by what they held, grouped by command name (a
    job of many processes is one suspect to move); each names the process
    that held the CPU longest."""
    ranked = sorted(by_suspect.items(), key=lambda item: -sum(item[1].values()))[:top]
    return [Suspect(pid=max(pids, key=pids.__getitem__), comm=comm, wait_ns=sum(pids.values()))
            for comm, pids in ranked]


def _tied(values) -> bool:
    """Whether the largest of ``values`` is shared."""
    top = sorted(values, reverse=True)[:2]
    return len(top) == 2 and top[0] == top[1]


def _in_order(charges: dict, kind: str, first_seen: Callable[[set[tuple], int], dict[tuple, int]]) -> dict:
    """``charges`` (key -> ns) in the order the walk first charged them
    where the largest is tied (max() keeps the first), else as they are."""
    if not _tied(charges.values()):
        return charges
    top = max(charges.values())
    order = first_seen({(kind, key) for key, ns in charges.items() if ns == top}, 1)  # max() keeps the first tied
    return dict(sorted(charges.items(), key=lambda item: order.get((kind, item[0]), len(order))))


def _charged(totals: dict[tuple, int], runq: tuple[int, int, int], pids: set[int],
             first_seen: Callable[[set[tuple], int], dict[tuple, int]]) -> Charged:
    """The charges from the keys' totals, ties broken as the walk broke them."""
    throttles = {key[1]: v for key, v in totals.items() if key[0] == "throttle"}
    sources = {key[1]: v for key, v in totals.items() if key[0] == "irq"}
    suspects = {key: v for key, v in totals.items() if key[0] == "suspect" and v > 0}
    by_suspect: dict[str, dict[int, int]] = defaultdict(dict)
    for (_, comm, pid), v in suspects.items():
        by_suspect[comm][pid] = v
    comms = [sum(pids.values()) for pids in by_suspect.values()]
    if len(set(comms)) < len(comms) or any(_tied(pids.values()) for pids in by_suspect.values()):
        order = first_seen(set(suspects), len(suspects))
        by_suspect = defaultdict(dict)
        for (_, comm, pid), v in sorted(suspects.items(), key=lambda item: order.get(item[0], len(order))):
            by_suspect[comm][pid] = v
    throttled = sum(throttles.values())
    return Charged(runq=runq, suspects=rank_suspects(by_suspect, TOP_SUSPECTS), throttled=throttled,
                   throttles=_in_order(throttles, "throttle", first_seen) if throttled else throttles,
                   irq=totals.get(("stolen",), 0), sources=_in_order(sources, "irq", first_seen),
                   irq_records={}, own_ns=totals.get(("own",), 0),
                   own_threads={key[1] for key, v in totals.items() if key[0] == "own thread" and v > 0},
                   idle_ns=totals.get(("idle",), 0), pids=pids)


def _merged(intervals: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted intervals merged into disjoint ones: (starts, ends)."""
    starts: list[int] = []
    ends: list[int] = []
    for a, b in intervals:
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


class SplitCache:
    """Whole waits' splits kept from one due() batch to the next: a wait
    stays in the windows of several batches (a long request's, the grace
    period's), and its split changes only when a throttling or interrupt
    interval that touches it arrives (``touched``), its process's record
    changes, or that evidence expires (``forget`` the host). A batch keeps
    only what it used (``end_batch``): memory stays that of one batch."""

    def __init__(self) -> None:
        self._kept: dict[str, dict[int, tuple]] = defaultdict(dict)  # host -> id(wait) -> (wait, record, split)
        self._used: dict[str, dict[int, tuple]] = defaultdict(dict)
        self._touched: dict[str, list[tuple[int, int]]] = defaultdict(list)  # host -> intervals arrived since

    def touched(self, host: str, start_ns: int, end_ns: int) -> None:
        self._touched[host].append((start_ns, end_ns))

    def forget(self, host: str) -> None:
        self._kept.pop(host, None)
        self._used.pop(host, None)

    def get(self, event: RunqEvent, record: object, split: Callable[[], Split]) -> Split:
        """The wait's split, from the cache where nothing it depends on changed since."""
        return self.get_many([event], [record], lambda _missing: [split()])[0]

    def get_many(self, events: list[RunqEvent], records: Sequence[object],
                 split: Callable[[list[int]], list[Split]]) -> list[Split]:
        """The waits' splits, from the cache where nothing they depend on
        changed since; ``split``: those of the waits at the positions given (the rest)."""
        if self._touched:
            self._drop_touched()
        out: list = [None] * len(events)
        missing = []
        for k, (event, record) in enumerate(zip(events, records)):
            key, used = id(event), self._used[event.host]
            found = used.get(key) or self._kept[event.host].get(key)
            if found is None or found[0] is not event or found[1] is not record:  # an id reused, or a new record
                missing.append(k)
            else:
                used[key], out[k] = found, found[2]
        for k, value in zip(missing, split(missing) if missing else ()):
            self._used[events[k].host][id(events[k])] = (events[k], records[k], value)
            out[k] = value
        return out

    def end_batch(self) -> None:
        self._kept, self._used = self._used, defaultdict(dict)

    def _drop_touched(self) -> None:
        for host, intervals in self._touched.items():
            starts, ends = _merged(sorted(intervals))
            for cache in (self._kept.get(host, {}), self._used.get(host, {})):
                for key, (event, _record, _split) in list(cache.items()):
                    k = bisect.bisect_left(ends, event.ts_ns - event.wait_ns)  # the first ending at or after it began
                    if k < len(starts) and starts[k] <= event.ts_ns:
                        del cache[key]
        self._touched.clear()
