# SPDX-License-Identifier: Apache-2.0
"""streams/culprits.py's ``split_wait`` for many run-queue parts at once,
over numpy columns of the throttling and interrupt records they overlap.

A due() batch splits every wait its windows hold (streams/wait_index.py's
build) and every part a request's window clips off a wait (its edges): on
the vLLM mix that was ~36 splits a request at ~10 us each in Python, most
of attribution's time (issue 39). Here the parts are grouped by what their
split reads (the process's cgroup chain for throttling, the CPU for
interrupts) and each group's overlaps are computed as arrays: a search of
the records' starts per part, then one vector step per record a part can
overlap (a handful: the samplers' records do not overlap one another).

Exactly split_wait's answer, part for part: the same integer arithmetic
(floors per record, the float scale of the interrupt shares, done per part
in Python as there), sources in the order split_wait meets them, and the
same records. Where int64 could overflow (a product of a record's time and
a part's length past 2**62) the parts take split_wait itself.
tests/unit/streams/test_split_columns.py holds it to split_wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jitterscope.schemas.events import CgroupThrottle, IrqTime, ProcessInfo, RunqEvent
from jitterscope.streams.culprits import cgroup_ancestors, split_wait
from jitterscope.streams.evidence import HostEvidence, SortedEvidence
from jitterscope.streams.throttle_index import throttled_span

Split = tuple[int, str, list[tuple[tuple, int, IrqTime]], int]
_SAFE = 2 ** 62  # products of ns below this stay inside int64
_EXACT = 2 ** 53  # ns below this are exact as floats: the interrupt scale is then Python's, bit for bit


@dataclass
class Splits:
    """Parts' splits as columns: per part its throttled ns, the cgroup
    charged and its interrupt ns; per interrupt share (part-major, each
    part's sources in split_wait's order) its part, source, ns and record."""

    cut: np.ndarray
    charged: np.ndarray  # the cgroup charged, in cgroup_names (-1: none)
    cgroup_names: list[str]
    stolen: np.ndarray
    part: np.ndarray
    source_code: np.ndarray  # in source_names
    source_names: list[tuple]
    ns: np.ndarray
    record_at: np.ndarray  # in records
    records: list[IrqTime]

    @property
    def cgroups(self) -> list[str]:
        return [self.cgroup_names[c] if c >= 0 else "" for c in self.charged.tolist()]

    @property
    def record(self) -> list[IrqTime]:
        return [self.records[k] for k in self.record_at.tolist()]

    @property
    def source(self) -> list[tuple]:
        return [self.source_names[c] for c in self.source_code.tolist()]


def split_columns(evidence: HostEvidence, cgroups: list[str], owner: np.ndarray, cpu: np.ndarray, idle: np.ndarray,
                  lo: np.ndarray, hi: np.ndarray) -> Splits:
    """split_wait of each part [lo[k], hi[k]] of a wait on CPU cpu[k] of a
    process in cgroup cgroups[owner[k]] ("": none known), the idle task next
    where idle[k], as columns. Raises OverflowError where int64 or float64
    would not give split_wait's integers."""
    cut, charged, cgroup_names = _throttled_many(evidence, cgroups, owner, idle, lo, hi)
    part, source, source_names, ns, record_at, records = _irq_many(evidence, cpu, lo, hi)
    spent = np.zeros(len(lo), dtype=np.int64)
    np.add.at(spent, part, ns)
    left = hi - lo - cut
    if len(lo) and max(int(spent.max()), int(left.max())) >= _EXACT:
        raise OverflowError
    scale = np.where(spent > 0, np.minimum(1.0, left / np.maximum(spent, 1)), 0.0)  # at most what the wait has left
    return Splits(cut=cut, charged=charged, cgroup_names=cgroup_names, stolen=(spent * scale).astype(np.int64),
                  part=part, source_code=source, source_names=source_names, ns=(ns * scale[part]).astype(np.int64),
                  record_at=record_at, records=records)


def split_many(evidence: HostEvidence, infos: list[ProcessInfo | None], events: list[RunqEvent], los: list[int],
               his: list[int]) -> list[Split]:
    """[split_wait(evidence, infos[k], events[k], los[k], his[k]) for each k], computed column-wise."""
    if not events:
        return []
    cgroups: dict[str, int] = {}
    owner = np.array([cgroups.setdefault(info.cgroup if info else "", len(cgroups)) for info in infos])
    try:
        splits = split_columns(evidence, list(cgroups), owner, np.array([e.cpu for e in events]),
                               np.array([e.suspect_pid == 0 for e in events]), np.array(los, dtype=np.int64),
                               np.array(his, dtype=np.int64))
    except OverflowError:
        return [split_wait(evidence, info, event, a, b) for info, event, a, b in zip(infos, events, los, his)]
    shares: list[list] = [[] for _ in events]
    for k, key, ns, record in zip(splits.part.tolist(), splits.source, splits.ns.tolist(), splits.record):
        shares[k].append((key, ns, record))
    return list(zip(splits.cut.tolist(), splits.cgroups, shares, splits.stolen.tolist()))


def _columns(found: SortedEvidence, lo: int, hi: int) -> tuple[int, list]:
    """The records of ``found`` that parts inside [lo, hi] can overlap (as
    SortedEvidence.overlapping finds them): (offset of the first, them)."""
    first, last = found.overlapping_range(lo, hi)
    return first, found.events[first:last]


def _throttled_many(evidence: HostEvidence, cgroups: list[str], owner: np.ndarray, idle: np.ndarray,
                    lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """culprits.throttled for every part: (throttled ns, the cgroup charged
    as a place in the names, -1 for none; the names)."""
    cut, charged = np.zeros(len(lo), dtype=np.int64), np.full(len(lo), -1, dtype=np.int64)
    names: dict[str, int] = {}
    for rank_of_owner, cgroup in enumerate(cgroups):
        if not cgroup:
            continue
        at = np.flatnonzero(owner == rank_of_owner)
        if not len(at):
            continue
        low, high = lo[at], hi[at]
        best, which = np.zeros(len(at), dtype=np.int64), np.full(len(at), -1)
        chain = cgroup_ancestors(cgroup)
        for rank, path in enumerate(chain):
            found = evidence.get((path, CgroupThrottle))
            if not found or not found.events:
                continue
            ns = _throttle_ns(found, low, high, idle[at])
            better = ns > best
            best, which = np.where(better, ns, best), np.where(better, rank, which)
        cut[at] = np.minimum(best, high - low)
        codes = np.array([names.setdefault(path, len(names)) for path in chain] + [-1], dtype=np.int64)
        charged[at] = codes[which]  # which -1: the last, none
    return cut, charged, list(names)


def _throttle_ns(found: SortedEvidence, low: np.ndarray, high: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """Per part, the throttled ns one cgroup's records explain (culprits.throttled's inner loop)."""
    reach = np.where(idle, found.events[-1].period_us * 1000, 0)  # a span begins up to a period early
    offset, records = _columns(found, int(low.min()), int((high + reach).max()))
    ns = np.zeros(len(low), dtype=np.int64)
    if not records:
        return ns
    starts = np.array(found.starts[offset:offset + len(records)], dtype=np.int64)
    ends = np.array([r.ts_ns for r in records], dtype=np.int64)
    throttled = np.array([r.throttled_ns for r in records], dtype=np.int64)
    interval = np.array([r.interval_ns for r in records], dtype=np.int64)
    begins = np.array([throttled_span(r)[0] for r in records], dtype=np.int64)
    if int(throttled.max(initial=0)) * int((high - low).max(initial=0)) >= _SAFE:
        raise OverflowError
    first = np.searchsorted(starts, low - found.longest_ns, "left")
    last = np.searchsorted(starts, high + reach, "right")
    for step in range(int((last - first).max(initial=0))):
        j = first + step
        valid = j < last
        j = np.where(valid, j, 0)
        spread_over = np.maximum(0, np.minimum(high, ends[j]) - np.maximum(low, starts[j]))
        spread = np.minimum(spread_over, throttled[j] * spread_over // interval[j])
        whole = np.maximum(0, np.minimum(high, ends[j]) - np.maximum(low, begins[j]))
        ns += np.where(valid, np.where(idle, whole, spread), 0)
    return ns


def _irq_many(evidence: HostEvidence, cpu: np.ndarray, lo: np.ndarray,
              hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple], np.ndarray, np.ndarray, list[IrqTime]]:
    """culprits.irq_by_source for every part, unscaled, as shares (part,
    source, ns, the source's latest record), part-major and in split_wait's
    order within a part. Every CPU's records in one table keyed (CPU, start):
    one search for all the parts, whatever their CPUs."""
    none: tuple = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), [], np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64), [])
    cpus = np.unique(cpu).tolist() if len(cpu) else []
    table = _irq_table(evidence, cpus, int(lo.min()), int(hi.max())) if cpus else None
    if table is None:
        return none
    rank_of, longest, keys, starts, records, span, base = table
    ranks = np.array([rank_of.get(c, -1) for c in cpus])[np.searchsorted(cpus, cpu)]
    mine = np.nonzero(ranks >= 0)[0]
    low, high, ranks = lo[mine], hi[mine], ranks[mine]
    first = np.searchsorted(keys, ranks * span + np.clip(low - longest[ranks] - base, 0, span - 1), "left")
    last = np.searchsorted(keys, ranks * span + np.clip(high - base, 0, span - 1), "right")
    steps = int((last - first).max(initial=0))
    if not steps:
        return none
    ends = np.array([r.ts_ns for r in records], dtype=np.int64)
    time = np.array([r.time_ns for r in records], dtype=np.int64)
    interval = np.array([r.interval_ns for r in records], dtype=np.int64)
    if int(time.max(initial=0)) * int((high - low).max(initial=0)) >= _SAFE:
        raise OverflowError
    j = first[:, None] + np.arange(steps)[None, :]  # part x step: the record met at that step
    valid = j < last[:, None]
    j = np.where(valid, j, 0)
    part = np.minimum(high[:, None], ends[j]) - np.maximum(low[:, None], starts[j])
    valid &= part > 0
    rows, cols = np.nonzero(valid)  # row-major: each part's records in split_wait's order
    if not len(rows):  # records in reach, none overlapping a part by a nanosecond
        return none
    met = j[rows, cols]
    ns = time[met] * part[rows, cols] // interval[met]
    names: dict[tuple, int] = {}
    source = np.array([names.setdefault((r.cpu, r.kind, r.source), len(names)) for r in records], dtype=np.int64)
    # one share per (part, source): the sum of its records' ns, the last record, at the first one's place
    order = np.argsort(mine[rows] * len(names) + source[met], kind="stable")
    key = (mine[rows] * len(names) + source[met])[order]
    begin = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    firsts, lasts = order[begin], order[np.r_[begin[1:], len(order)] - 1]
    sums = np.add.reduceat(ns[order], begin)
    place = np.argsort(firsts, kind="stable")
    return (mine[rows[firsts]][place], source[met[firsts]][place], list(names), sums[place],
            met[lasts][place], records)


def _irq_table(evidence: HostEvidence, cpus: list[int], lo: int, hi: int) -> tuple | None:
    """The interrupt records of ``cpus`` that parts inside [lo, hi] can
    overlap, as one table sorted by (CPU rank, start): (rank per CPU, longest
    record per rank, the sort keys, starts, records, the keys' span per rank,
    the starts' base); None where there are none."""
    rank_of: dict[int, int] = {}
    longest: list[int] = []
    starts: list = []
    records: list = []
    for cpu in cpus:
        found = evidence.get((cpu, IrqTime))
        if found and found.events:
            first, last = found.overlapping_range(lo, hi)
            rank_of[cpu] = len(longest)
            longest.append(found.longest_ns)
            starts += found.starts[first:last]
            records += [(rank_of[cpu], r) for r in found.events[first:last]]
    if not records:
        return None
    base = min(starts) - 1  # every start at 1 or more past it: a search clipped to 0 finds no start
    span = max(starts) - base + 2  # a search clipped to span - 1 passes every start
    if len(longest) * span >= _SAFE:
        raise OverflowError
    keys = np.array([rank * span for rank, _ in records], dtype=np.int64) + (np.array(starts, dtype=np.int64) - base)
    return (rank_of, np.array(longest, dtype=np.int64), keys, np.array(starts, dtype=np.int64),
            [r for _, r in records], span, base)
