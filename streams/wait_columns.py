# SPDX-License-Identifier: Apache-2.0
"""A serving group's run-queue waits as numpy columns for one due() batch,
answering every request of the batch at once: the columnar form of
streams/wait_index.py (issue 39: attribution at <= 50 us a request).

WaitIndex made a request cheap (bisects per thread and per key) but built
its index in Python, wait by wait, every batch, and asked per request in
Python; on the vLLM mix that was ~1 ms a request. Here the batch reads its
waits as arrays (streams/evidence.py's ``SortedEvidence.columns``), splits
them all at once (streams/split_columns.py), and answers all its windows
with array searches:

- the waits in thread order ((pid, tid), then start), searched with keys
  (thread, time): per window and thread the range of waits it overlaps, its
  edge parts (clipped), totals (prefix sums) and longest (a sparse table);
- every wait's and edge part's charges (throttled cgroup, interrupt
  source, suspect (comm, pid), the group's own holder threads, idle) as
  (key, value) entries; per key prefix sums over the waits in end order:
  a window's sum is the waits ending inside it, less those starting before
  it (whole shares out), plus its edge parts (clipped shares in), exactly
  as WaitIndex adds them;
- the union of the waits, for how long any thread waited.

Exactness: where the walk's order decides (two keys tie for the largest
charge) the window's answer is ``Tie`` and the request walks
(streams/attribution.py); an interrupt source's record is the one of the
last part, in the walk's order, whose split names it. A batch whose
threads repeat waits, or whose numbers would leave int64 or float64
exactness, is not indexed here (None). tests/unit/streams/test_wait_index.py
holds the answers to the walk's.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from typing import Callable

import numpy as np

from jitterscope.schemas.events import ProcessInfo, RunqEvent
from jitterscope.streams.evidence import COMM_IDS, HostEvidence
from jitterscope.streams.split_columns import Splits, split_columns
from jitterscope.streams.wait_charges import Keys, charged, entries, totals
from jitterscope.streams.wait_index import Charged, Tie

_SAFE = 2 ** 62


class _Waits:
    """The batch's waits in thread order, as columns."""

    # the columns, from gather(): each wait's start and end, its process, thread and CPU, the holder's pid, tid and
    # command (COMM_IDS), and where its event is (``event``: the source's list, the place in it)
    begin: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    cpu: np.ndarray
    spid: np.ndarray
    stid: np.ndarray
    comm: np.ndarray
    source: np.ndarray
    at: np.ndarray

    def __init__(self, columns: dict[str, np.ndarray], events: list[list[RunqEvent]]):
        self.__dict__.update(columns)  # begin, end, pid, tid, cpu, spid, stid, comm, source, at
        self.sources = events  # per source (process), its events; (source, at) names a wait's event
        self.length = self.end - self.begin
        keys = (self.pid << 32) | self.tid
        self.threads, self.thread = np.unique(keys, return_inverse=True)  # sorted: the walk's (pid, tid) order
        self.offsets = np.searchsorted(self.thread, np.arange(len(self.threads) + 1))
        self.sums = np.r_[0, np.cumsum(self.length)]

    def event(self, k: int) -> RunqEvent:
        return self.sources[self.source[k]][self.at[k]]


def gather(evidence: HostEvidence, group: set[int] | None, lo_ns: int, hi_ns: int) -> _Waits | None:
    """The group's waits that overlap [lo_ns, hi_ns], as WaitIndex.build
    takes them; None where some thread's waits overlap (the walk trims those)."""
    if group is None:
        pids = sorted(k for (k, kind) in evidence if kind is RunqEvent)
    else:
        pids = sorted(pid for pid in group if (pid, RunqEvent) in evidence)
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    events = []
    for source, pid in enumerate(pids):
        found = evidence[(pid, RunqEvent)]
        cols = found.columns()
        first, last = found.overlapping_range(lo_ns, hi_ns)
        for name, values in zip(("begin", "end", "tid", "cpu", "spid", "stid", "comm"), (found.starts, *cols)):
            parts[name].append(np.array(values[first:last], dtype=np.int64))
        parts["pid"].append(np.full(last - first, pid, dtype=np.int64))
        parts["source"].append(np.full(last - first, source, dtype=np.int64))
        parts["at"].append(np.arange(first, last, dtype=np.int64))
        events.append(found.events)
    if not events:
        return None
    columns = {name: np.concatenate(values) for name, values in parts.items()}
    begin, end = columns["begin"], columns["end"]
    keep = (end > begin) & (end > lo_ns) & (begin < hi_ns)  # no part from an empty wait
    order = np.lexsort((columns["begin"], columns["tid"], columns["pid"]))
    order = order[keep[order]]
    columns = {name: values[order] for name, values in columns.items()}
    if not len(order) or int(columns["pid"].max()) >= 2 ** 31 or int(columns["tid"].max()) >= 2 ** 31:
        return None
    same = (columns["pid"][1:] == columns["pid"][:-1]) & (columns["tid"][1:] == columns["tid"][:-1])
    if np.any(same & (columns["begin"][1:] < columns["end"][:-1])):
        return None
    return _Waits(columns, events)


class ColumnarIndex:
    """One serving group's waits over one due() batch, with every window's answer."""

    _behind: np.ndarray  # per window (row) and thread: its wait behind the group's own threads (``behind``)
    _rows: dict[tuple[int, int], int]  # window -> its row

    def __init__(self, waits: _Waits, group: set[int] | None, answers: dict, union: tuple):
        self.waits, self.group, self._answers = waits, group, answers
        self.union_starts, self.union_ends, self.union_sums = union
        self.parts_split: dict[tuple[int, int, int], tuple] = {}  # (id(wait), lo, hi) -> its part's split

    @classmethod
    def build(cls, evidence: HostEvidence, group: set[int] | None, lo_ns: int, hi_ns: int,
              windows: list[tuple[int, int]], record_of: Callable[[int], ProcessInfo | None]) -> ColumnarIndex | None:
        """The index of the group's waits over the batch's windows, each
        window answered; None where WaitIndex or the walk must answer."""
        waits = gather(evidence, group, lo_ns, hi_ns)
        if waits is None:
            return None
        windows = sorted(set(windows))
        try:
            return cls._answer(evidence, group, waits, windows, record_of)
        except OverflowError:
            return None

    @classmethod
    def _answer(cls, evidence: HostEvidence, group: set[int] | None, waits: _Waits, windows: list[tuple[int, int]],
                record_of: Callable[[int], ProcessInfo | None]) -> ColumnarIndex:
        start = np.array([w[0] for w in windows], dtype=np.int64)
        end = np.array([w[1] for w in windows], dtype=np.int64)
        ranges = _ranges(waits, start, end)
        edge_r, edge_k, edge_lo, edge_hi = _edges(waits, ranges, start, end)
        pids = waits.pid
        cgroups: dict[str, int] = {}
        owner_of = {pid: cgroups.setdefault(getattr(record_of(pid), "cgroup", "") or "", len(cgroups))
                    for pid in np.unique(pids).tolist()}
        owner = np.array([owner_of[p] for p in pids.tolist()]) if len(pids) else np.zeros(0, dtype=np.int64)
        k = np.r_[np.arange(len(pids)), edge_k]
        splits = split_columns(evidence, list(cgroups), owner[k], waits.cpu[k], waits.spid[k] == 0,
                               np.r_[waits.begin, edge_lo], np.r_[waits.end, edge_hi])
        group_pids = np.array(sorted(group) if group else [], dtype=np.int64)
        keys = Keys()
        made = entries(keys, splits, waits, k, np.r_[waits.length, edge_hi - edge_lo], group_pids, group is not None)
        edges = (edge_r, edge_k, edge_lo, edge_hi)
        answers = _answers(keys, totals(keys, made, waits, (start, end), edges, len(pids)), waits, ranges, edges,
                           _Latest(splits, ranges, edges, len(pids)))
        index = cls(waits, group, dict(zip(windows, answers)), _union(waits))
        index._keep_edge_splits(splits, len(pids), edge_k, edge_lo, edge_hi)
        index._behind = _behind(waits, ranges, edges, np.isin(waits.spid, group_pids))
        index._rows = {window: r for r, window in enumerate(windows)}
        return index

    def _keep_edge_splits(self, splits: Splits, whole: int, edge_k: np.ndarray, edge_lo: np.ndarray,
                          edge_hi: np.ndarray) -> None:
        """What parts() hands the walk of a carried request: its whole waits' and edge parts' splits."""
        self._splits, self._whole = splits, whole
        self._edges = (edge_k, edge_lo, edge_hi)
        self._edge_at: dict[tuple[int, int, int], int] | None = None  # made when a carried request first asks
        self._lists: tuple | None = None

    def charges(self, start_ns: int, end_ns: int, _edge=None) -> tuple[dict, Charged]:
        """Run-queue ns per thread and the charges of a window of the batch (WaitIndex.charges). Raises Tie."""
        found = self._answers.get((start_ns, end_ns))
        if found is None or found is Tie:
            raise Tie
        per_thread, charged = found
        return defaultdict(int, per_thread), charged

    def behind(self, start_ns: int, end_ns: int, tid: int) -> int:
        """How long the threads ``tid`` (of any of the group's processes) waited
        inside a window of the batch behind the group's own threads (thread_budget.behind_own_ns)."""
        row = self._behind[self._rows[(start_ns, end_ns)]]
        return int(row[(self.waits.threads & 0xFFFFFFFF) == tid].sum())

    def union_ns(self, start_ns: int, end_ns: int) -> int:
        """How long at least one of the group's threads waited inside [start, end]."""
        a = bisect.bisect_right(self.union_ends, start_ns)
        b = bisect.bisect_left(self.union_starts, end_ns)
        if b <= a:
            return 0
        return (self.union_sums[b] - self.union_sums[a] - max(0, start_ns - self.union_starts[a])
                - max(0, self.union_ends[b - 1] - end_ns))

    def parts(self, start_ns: int, end_ns: int, tids: set[int]) -> list[tuple[RunqEvent, int, int, bool]]:
        """The walk's parts (event, lo, hi, whole) of the threads ``tids``;
        each part's split is kept in ``parts_split`` for the walk."""
        if self._edge_at is None:
            self._edge_at = {(k, lo, hi): self._whole + e for e, (k, lo, hi) in enumerate(zip(*(
                column.tolist() for column in self._edges)))}
        if self._lists is None:
            w = self.waits
            self._lists = (w.begin.tolist(), w.end.tolist(), w.offsets.tolist(),
                           [(key & 0xFFFFFFFF, t) for t, key in enumerate(w.threads.tolist())])
        begins, ends, offsets, threads = self._lists
        out = []
        for tid, t in threads:
            if tid not in tids:
                continue
            a, b = offsets[t], offsets[t + 1]
            for k in range(bisect.bisect_right(ends, start_ns, a, b), bisect.bisect_left(begins, end_ns, a, b)):
                lo, hi = max(begins[k], start_ns), min(ends[k], end_ns)
                event = self.waits.event(k)
                out.append((event, lo, hi, lo == begins[k] and hi == ends[k]))
                at = k if out[-1][3] else self._edge_at.get((k, lo, hi))
                if at is not None:  # the walk's split of it, made when the walk asks
                    self.parts_split[(id(event), lo, hi)] = (event, functools.partial(self._split, at))
        return out

    def _split(self, at: int) -> tuple:
        """split_wait's tuple of the part at ``at`` in the batch's splits."""
        s = self._splits
        a, b = np.searchsorted(s.part, [at, at + 1])  # the shares are part-major
        shares = [(s.source_names[c], ns, s.records[r]) for c, ns, r
                  in zip(s.source_code[a:b].tolist(), s.ns[a:b].tolist(), s.record_at[a:b].tolist())]
        code = int(s.charged[at])
        return int(s.cut[at]), s.cgroup_names[code] if code >= 0 else "", shares, int(s.stolen[at])


def _ranges(waits: _Waits, start: np.ndarray, end: np.ndarray) -> dict[str, np.ndarray]:
    """Per window (row) and thread (column): the range [i, j) of its waits
    the window overlaps, whether the first and last are clipped, and the
    thread's total inside the window."""
    base = int(waits.begin.min()) - 1  # every time at 1 or more past it: a search clipped to 0 finds none
    span = int(waits.end.max()) - base + 2  # a search clipped to span - 1 passes every time
    threads = len(waits.threads)
    if threads * span >= _SAFE:
        raise OverflowError
    lane = (np.arange(threads, dtype=np.int64) * span)[None, :]
    i = np.searchsorted(waits.thread * span + (waits.end - base),
                        lane + np.clip(start - base, 0, span - 1)[:, None], "right")
    j = np.searchsorted(waits.thread * span + (waits.begin - base),
                        lane + np.clip(end - base, 0, span - 1)[:, None], "left")
    has = j > i
    ii, jj = np.where(has, i, 0), np.where(has, j - 1, 0)
    first = has & (waits.begin[ii] < start[:, None])
    last = has & (waits.end[jj] > end[:, None])
    total = (waits.sums[j] - waits.sums[i] - np.where(first, start[:, None] - waits.begin[ii], 0)
             - np.where(last, waits.end[jj] - end[:, None], 0))
    return {"i": i, "j": j, "has": has, "first": first, "last": last, "total": np.where(has, total, 0)}


def _answers(keys: Keys, table: np.ndarray, waits: _Waits, ranges: dict, edges: tuple, latest: _Latest) -> list:
    """Per window: (run-queue ns per thread, its Charged), or Tie."""
    edge_r, _edge_k, edge_lo, edge_hi = edges
    longest = _longest(waits, ranges)
    np.maximum.at(longest, edge_r, edge_hi - edge_lo)
    runq = list(zip(ranges["total"].sum(axis=1).tolist(), longest.tolist(),
                    (ranges["j"] - ranges["i"]).sum(axis=1).tolist()))
    threads = [(key >> 32, key & 0xFFFFFFFF) for key in waits.threads.tolist()]
    pids = [threads[t][0] for t in range(len(threads))]
    per_window = ranges["total"].tolist()  # a thread with a part has a total: parts are never empty
    answers, sources = charged(keys, table, runq, [{p for p, total in zip(pids, row) if total} for row in per_window],
                               comm_name, latest.first)
    records = latest.records(sources)
    out = []
    for answer, window_totals, source, record in zip(answers, per_window, sources.tolist(), records):
        if answer is not Tie:
            if answer.irq:
                answer.irq_records = {keys.blocks["irq"][1][source]: record}
            answer = ({thread: total for thread, total in zip(threads, window_totals) if total}, answer)
        out.append(answer)
    return out


def _behind(waits: _Waits, ranges: dict, edges: tuple, own: np.ndarray) -> np.ndarray:
    """Per window and thread, its waits' ns inside the window behind the group's own threads (``own``)."""
    sums = np.r_[0, np.cumsum(np.where(own, waits.length, 0))]
    a, b = ranges["i"] + ranges["first"], ranges["j"] - ranges["last"]
    out = np.where(b > a, sums[np.maximum(a, b)] - sums[a], 0)
    edge_r, edge_k, edge_lo, edge_hi = edges
    np.add.at(out, (edge_r, waits.thread[edge_k]), np.where(own[edge_k], edge_hi - edge_lo, 0))
    return out


def _longest(waits: _Waits, ranges: dict) -> np.ndarray:
    """Per window, the longest of the waits whole inside it (a sparse table of the lengths, in thread order)."""
    table = [waits.length]
    while 2 ** len(table) <= len(waits.length):
        row, half = table[-1], 2 ** (len(table) - 1)
        table.append(np.maximum(row[:-half], row[half:]))
    a = ranges["i"] + ranges["first"]
    b = ranges["j"] - ranges["last"]
    some = b > a
    level = np.frexp(np.maximum(b - a, 1))[1] - 1  # floor(log2): exact for any int64 count
    out = np.zeros(a.shape, dtype=np.int64)
    for k, row in enumerate(table):
        at = some & (level == k)
        if at.any():
            out[at] = np.maximum(row[a[at]], row[b[at] - 2 ** k])
    return out.max(axis=1, initial=0)


class _Latest:
    """The record the walk kept for an interrupt source: its record in the
    last part, in (pid, tid, start) order, whose split names it (a share of
    0 ns names it too). WaitIndex._latest_record, for one window at a time."""

    def __init__(self, splits: Splits, ranges: dict, edges: tuple, whole: int):
        self.splits, self.ranges, self.whole = splits, ranges, whole
        self.edge_r, self.edge_k = edges[0], edges[1]
        self.code = {name: c for c, name in enumerate(splits.source_names)}
        mine = splits.part < whole
        self.stride = whole + 1
        key = splits.source_code[mine] * self.stride + splits.part[mine]
        order = np.argsort(key, kind="stable")
        # led by a key below every search, so that "the last before" is always an index (-1: none)
        self.by = np.r_[-1, np.flatnonzero(mine)[order]]
        self.keys = np.r_[-1, key[order]]
        self.edge_shares = np.flatnonzero(~mine)

    def first(self, r: int, codes: np.ndarray) -> int | None:
        """Of the sources ``codes``, the one the walk met first in window r:
        in the first part, in (pid, tid, start) order, whose split names one
        of them, the first so named (None where none is named)."""
        ranges, stride, s = self.ranges, self.stride, self.splits
        lo = (ranges["i"][r] + ranges["first"][r])[ranges["has"][r]]
        hi = (ranges["j"][r] - ranges["last"][r])[ranges["has"][r]]
        found = []  # (part's position, share) of each source's first share
        for c in codes.tolist():
            at = np.searchsorted(self.keys, c * stride + lo, "left")  # its first share at or after lo
            key = self.keys[np.minimum(at, len(self.keys) - 1)]
            inside = (hi > lo) & (at < len(self.keys)) & (key < c * stride + hi)
            found += [(int(key[k] - c * stride), int(self.by[at[k]])) for k in np.flatnonzero(inside)[:1].tolist()]
        shares = self.edge_shares[np.isin(s.source_code[self.edge_shares], codes)]
        e = s.part[shares] - self.whole
        here = self.edge_r[e] == r
        found += zip(self.edge_k[e[here]].tolist(), shares[here].tolist())
        return int(s.source_code[min(found)[1]]) if found else None

    def records(self, codes: np.ndarray) -> list:
        """Per window, the record of source ``codes[r]`` the walk kept (None where codes[r] is -1)."""
        ranges, stride = self.ranges, self.stride
        lo = np.where(ranges["has"], ranges["i"] + ranges["first"], 0)
        hi = np.where(ranges["has"], ranges["j"] - ranges["last"], 0)
        base = (np.maximum(codes, 0) * stride)[:, None]
        at = np.searchsorted(self.keys, base + hi, "left") - 1  # the last share of the source before hi (or -1)
        found = self.keys[at]
        position = np.where((codes >= 0)[:, None] & (hi > lo) & (found >= base + lo), found - base, -1)
        rows = np.arange(len(codes))
        column = position.argmax(axis=1) if position.shape[1] else np.zeros(len(codes), dtype=np.int64)
        best = position[rows, column] if position.shape[1] else np.full(len(codes), -1)
        share = np.where(best >= 0, self.by[at[rows, column]] if position.shape[1] else -1, -1)
        shares = self.edge_shares
        e = self.splits.part[shares] - self.whole
        r = self.edge_r[e]
        mine = self.splits.source_code[shares] == codes[r]
        shares, r, position = shares[mine], r[mine], self.edge_k[e[mine]]
        order = np.lexsort((position, r))
        last = np.r_[r[order][1:] != r[order][:-1], True] if len(order) else np.zeros(0, dtype=bool)
        for window, pos, found in zip(r[order][last].tolist(), position[order][last].tolist(),
                                      shares[order][last].tolist()):
            if pos > best[window]:
                share[window] = found
        s = self.splits
        return [s.records[s.record_at[k]] if k >= 0 else None for k in share.tolist()]


def _edges(waits: _Waits, ranges: dict, start: np.ndarray,
           end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every window's edge parts (window, wait, lo, hi), as WaitIndex._threads
    clips them: a thread's first wait where it starts before the window,
    its last where it ends after (one part where that is the same wait)."""
    r1, t1 = np.nonzero(ranges["first"])
    k1 = ranges["i"][r1, t1]
    both = ranges["last"] & ~(ranges["first"] & (ranges["j"] - 1 == ranges["i"]))
    r2, t2 = np.nonzero(both)
    k2 = ranges["j"][r2, t2] - 1
    r, k = np.r_[r1, r2], np.r_[k1, k2]
    order = np.lexsort((k, r))
    r, k = r[order], k[order]
    return r, k, np.maximum(waits.begin[k], start[r]), np.minimum(waits.end[k], end[r])


def _union(waits: _Waits) -> tuple[list[int], list[int], list[int]]:
    """The union of the waits as disjoint intervals: (starts, ends, prefix sums of their lengths)."""
    order = np.lexsort((waits.end, waits.begin))
    begin, end = waits.begin[order], waits.end[order]
    reach = np.maximum.accumulate(end)
    new = np.r_[True, begin[1:] > reach[:-1]]  # WaitIndex's _merged: a start at the reach so far joins
    starts = begin[new]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(begin) - 1]
    ends = reach[last]
    return starts.tolist(), ends.tolist(), [0, *np.cumsum(ends - starts).tolist()]


def comm_name(comm: int) -> str:
    """The command name COMM_IDS numbered."""
    global _NAMES
    if comm >= len(_NAMES):
        _NAMES = list(COMM_IDS)
    return _NAMES[comm]


_NAMES: list[str] = []
