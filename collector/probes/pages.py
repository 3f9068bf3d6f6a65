# SPDX-License-Identifier: Apache-2.0
"""The "pages" signal and its loader for bpf/pages.bpf.c: pages each process
put on each NUMA node.

The kernel attributes page-cache insertions and page allocations to (tgid,
node), the node found from the page frame number in the pfn ranges given here
(a topology's ``NumaNode.pfn_ranges``, from /proc/zoneinfo). `read` turns the
cumulative counters into deltas since the previous read; a process's counters
are freed in the kernel once the read after its exit has reported them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from jitterscope.collector import hostinfo
from jitterscope.collector.probes import base
from jitterscope.collector.probes.base import UNKNOWN_NODE, delete_keys, map_items
from jitterscope.collector.probes.interface import BccSignal, ProbeContext
from jitterscope.schemas import events

MAX_PFN_RANGES = 16  # bpf/pages.h
MIN_PAGES = 256  # 1 MiB per interval: less page activity is not worth a record


@dataclass(frozen=True)
class RawPagePlacement:
    """Pages one process put on one node since the previous read."""

    pid: int            # tgid (0: allocations while a CPU was idle)
    node: int           # UNKNOWN_NODE when the page was in none of the ranges
    comm: str
    page_cache_pages: int  # file pages it added to the page cache
    alloc_pages: int       # pages allocated in its context
    memory_cgroup: str = ""  # its memory cgroup when read ("" = gone)
    exited: bool = False  # the process exited: its last counts (its allocations are freed)


def merge_ranges(pfn_ranges: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(node, start_pfn, end_pfn) ranges sorted, with touching or overlapping
    ranges of the same node merged (a node's zones are usually contiguous)."""
    merged: list[list[int]] = []
    for node, start, end in sorted(((n, s, e) for n, s, e in pfn_ranges if e > s),
                                   key=lambda r: (r[1], r[2])):
        if merged and merged[-1][0] == node and start <= merged[-1][2]:
            merged[-1][2] = max(merged[-1][2], end)
        else:
            merged.append([node, start, end])
    return [tuple(r) for r in merged]


def _validated(pfn_ranges: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    ranges = merge_ranges(pfn_ranges)
    if len(ranges) > MAX_PFN_RANGES:
        raise ValueError(f"{len(ranges)} pfn ranges after merging; the probe holds {MAX_PFN_RANGES}")
    if any(not 0 <= node < UNKNOWN_NODE for node, _, _ in ranges):
        raise ValueError(f"NUMA nodes must be in [0, {UNKNOWN_NODE}): {ranges}")
    return ranges


class PageProbe(base.BccProbe):
    source = "pages.bpf.c"

    def __init__(self, pfn_ranges: list[tuple[int, int, int]], proc: Path = Path("/proc")):
        """``pfn_ranges``: (node, start_pfn, end_pfn) with end exclusive; at
        most MAX_PFN_RANGES after merging adjacent ranges of a node."""
        ranges = _validated(pfn_ranges)  # before loading: a bad config fails fast
        super().__init__()
        self._proc = proc
        self._seen: dict[tuple[int, int], tuple[int, int]] = {}
        self._names: dict[int, str] = {}  # pid -> its name when last read
        self.set_ranges(ranges)

    def set_ranges(self, pfn_ranges: list[tuple[int, int, int]]) -> None:
        ranges = _validated(pfn_ranges)
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        for i, (node, start, end) in enumerate(ranges):
            leaf.ranges[i].start = start
            leaf.ranges[i].end = end
            leaf.ranges[i].node = node
        leaf.nr_ranges = len(ranges)
        leaf.configured = 1
        config[ctypes.c_int(0)] = leaf

    def read(self) -> dict[tuple[int, int], RawPagePlacement]:
        """(pid, node) -> pages since the last read (entries with none are left out)."""
        counts = self._bpf[b"counts"]
        exited = self._bpf[b"exited"]
        gone = {k.value for k in exited.keys()}  # before the counts: their last pages are in
        result, self._seen, stale = diff_counts(map_items(counts), self._seen, gone, self._comm, self._memory_cgroup)
        for pid in gone:
            self._names.pop(pid, None)
        delete_keys(counts, stale)
        delete_keys(exited, [exited.Key(pid) for pid in gone])
        return result

    def _comm(self, pid: int) -> str:
        """The process's name (its main thread's); for one that has exited,
        the name last read (its final counts come after its exit, and the
        kernel's entry names the thread that created it, before any exec)."""
        if pid == 0:
            return ""
        try:
            self._names[pid] = (self._proc / str(pid) / "comm").read_text().rstrip("\n")
        except OSError:
            return self._names.pop(pid, "")  # its last interval: not asked again
        return self._names[pid]

    def _memory_cgroup(self, pid: int) -> str:
        """The process's memory cgroup, when it is still there: read with its
        counts, so the evictor search need not wait for its process record."""
        try:
            return hostinfo.cpu_cgroup_path((self._proc / str(pid) / "cgroup").read_text(), "memory") if pid else ""
        except OSError:
            return ""

    def forget(self, pids: set[int]) -> None:
        """Drop kernel counters of processes (for exits the probe missed)."""
        counts = self._bpf[b"counts"]
        gone = [ident for ident in self._seen if ident[0] in pids]  # what the last read saw: one batch
        delete_keys(counts, [counts.Key(pid, node) for pid, node in gone])
        for ident in gone:
            del self._seen[ident]
        for pid in pids:
            self._names.pop(pid, None)


def diff_counts(entries, seen: dict[tuple[int, int], tuple[int, int]], gone: set[int],
                comm_of: Callable[[int], str], memory_cgroup_of: Callable[[int], str] = lambda pid: ""):
    """The kernel's cumulative ``counts`` entries ((struct page_key, struct
    page_counts) pairs, bpf/pages.h) as deltas against ``seen`` ((pid, node)
    -> (page_cache, alloc) already reported). ``gone``: pids that exited
    (their entries are reported one last time and returned for deletion);
    ``comm_of``: a live process's name, "" when unknown (the kernel's comm,
    the thread that created the entry, stands in); ``memory_cgroup_of``: its
    memory cgroup, "" when unknown. Returns (deltas, new seen, keys to delete).
    An exited process's entries are deltas even when nothing was added:
    they say it exited (``exited``)."""
    result: dict[tuple[int, int], RawPagePlacement] = {}
    now_seen: dict[tuple[int, int], tuple[int, int]] = {}
    stale = []
    comms: dict[int, tuple[str, str]] = {}
    for key, c in entries:
        ident = (key.pid, key.node)
        cache, alloc = c.page_cache_pages, c.alloc_pages
        before_cache, before_alloc = seen.get(ident, (0, 0))
        if cache < before_cache or alloc < before_alloc:  # deleted and restarted in between
            before_cache, before_alloc = 0, 0
        exited = key.pid in gone
        if exited:
            stale.append(key)
        else:
            now_seen[ident] = (cache, alloc)
        if cache > before_cache or alloc > before_alloc or exited:
            if key.pid not in comms:
                comms[key.pid] = (comm_of(key.pid) or base.c_string(bytes(c.comm)), memory_cgroup_of(key.pid))
            comm, memory_cgroup = comms[key.pid]
            result[ident] = RawPagePlacement(key.pid, key.node, comm, cache - before_cache, alloc - before_alloc,
                                             memory_cgroup, exited)
    return result, now_seen, stale


class PagesSignal(BccSignal):
    """Pages each process put on each NUMA node (the topology's pfn ranges);
    less than MIN_PAGES in an interval makes no record, but for the last one
    of a process whose pages were reported: it says the process exited (the
    evictor search no longer counts its allocations as held)."""

    name = "pages"
    publishes = (events.PagePlacement,)

    def __init__(self):
        super().__init__()
        self.reported: set[int] = set()  # pids with a record, not yet seen to exit

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        ranges = [(n.node, start, end) for n in context.topology["numa_nodes"] for start, end in n.pfn_ranges]
        self.probe = PageProbe(ranges, context.proc)

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        if not self.probe:
            return []
        records, exited = [], set()
        for (pid, node), p in sorted(self.probe.read().items()):
            if p.page_cache_pages + p.alloc_pages < MIN_PAGES and not (p.exited and pid in self.reported):
                continue
            if p.exited:
                exited.add(pid)
            else:
                self.reported.add(pid)
                self.ctx.describe_process(pid)
            records.append(self.ctx.record(
                events.PagePlacement, now_ns, pid=pid, comm=p.comm, node=node if node != UNKNOWN_NODE else -1,
                interval_ns=interval_ns, page_cache_pages=p.page_cache_pages, alloc_pages=p.alloc_pages,
                memory_cgroup=p.memory_cgroup, exited=p.exited))
        self.reported -= exited
        return records

    def forget(self, pids: set[int]) -> None:
        self.reported -= pids
        if self.probe:
            self.probe.forget(pids)
