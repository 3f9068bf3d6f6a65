"""Loader for bpf/migrate.bpf.c: CPU migrations per thread, cross-node ones apart.

The kernel counts every migration per thread; `read_counts` turns the
cumulative counters into deltas since the previous read. Moves to another
NUMA node (per the cpu -> node map the collector gives, from the host's
topology) are also counted apart and arrive one by one through the ring
buffer.

The tracepoint fires in the migrating context, not the migrated thread's, so
the kernel learns each thread's tgid and name at clone and rename; threads
older than the probe are seeded from /proc for target processes, and any
thread the kernel does not know (pid 0 in its records) is resolved from
/proc here.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from jitterscope.collector.probes import base

UNKNOWN_NODE = 255  # bpf/migrate.h


@dataclass(frozen=True)
class RawMigrations:
    """One thread's migrations since the previous read."""

    pid: int            # tgid, 0 when neither the kernel nor /proc knows it any more
    tid: int
    comm: str
    migrations: int
    cross_node: int     # of which moved it to another NUMA node
    last_cpu: int       # where the last migration put it


@dataclass(frozen=True)
class RawCrossNode:
    """A ring-buffer record: one move to another NUMA node, monotonic time."""

    ts_ns: int
    pid: int
    tid: int
    comm: str
    from_cpu: int
    to_cpu: int
    from_node: int
    to_node: int


def _thread(tid: int, proc: Path) -> tuple[int, str]:
    """(tgid, comm) of a live thread from /proc, (0, "") when it is gone."""
    try:
        comm = (proc / str(tid) / "comm").read_text().rstrip("\n")
        for line in (proc / str(tid) / "status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1]), comm
    except (OSError, ValueError, IndexError):
        pass
    return 0, ""


def _check_nodes(cpu_node: dict[int, int]) -> None:
    if any(not 0 <= node < UNKNOWN_NODE for node in cpu_node.values()):
        raise ValueError(f"NUMA nodes must be in [0, {UNKNOWN_NODE}): {cpu_node}")


class MigrationProbe(base.BccProbe):
    source = "migrate.bpf.c"

    def __init__(self, cpu_node: dict[int, int], target_pids: set[int] | None = None,
                 proc: Path = Path("/proc")):
        """``cpu_node``: each CPU's NUMA node (CPUs left out never count as
        cross-node). ``target_pids`` None watches every thread."""
        _check_nodes(cpu_node)  # before loading: a bad config fails fast
        super().__init__()
        self._proc = proc
        self._seen: dict[int, tuple[int, int]] = {}  # tid -> (migrations, cross_node) already reported
        self.filtering = target_pids is not None
        self.set_cpu_node(cpu_node)
        self.set_targets(target_pids or set())

    def set_cpu_node(self, cpu_node: dict[int, int]) -> None:
        _check_nodes(cpu_node)
        table = self._bpf[b"cpu_node"]
        table.clear()
        for cpu, node in cpu_node.items():
            table[table.Key(cpu)] = table.Leaf(node)

    def set_targets(self, pids: set[int]) -> None:
        """Watch the threads of ``pids`` (when filtering). Their existing
        threads are taught to the kernel from /proc; later ones it learns
        itself at clone."""
        wanted = set(pids) if self.filtering else set()
        targets = self._bpf[b"targets"]
        current = {k.value for k in targets.keys()}
        for pid in current - wanted:
            try:
                del targets[targets.Key(pid)]
            except KeyError:
                pass
        for pid in wanted - current:
            targets[targets.Key(pid)] = targets.Leaf(1)
        self._seed(wanted - current)
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        leaf.configured = 1
        leaf.filter_targets = int(self.filtering)
        config[ctypes.c_int(0)] = leaf

    def _seed(self, pids: Iterable[int]) -> None:
        tasks = self._bpf[b"tasks"]
        for pid in pids:
            try:
                tids = [int(t) for t in os.listdir(self._proc / str(pid) / "task")]
            except (OSError, ValueError):
                continue
            for tid in tids:
                tgid, comm = _thread(tid, self._proc)
                if tgid == pid:
                    leaf = tasks.Leaf()
                    leaf.pid = tgid
                    leaf.comm = comm.encode()[:15]
                    tasks[tasks.Key(tid)] = leaf

    def open(self, on_event: Callable[[RawCrossNode], None]) -> None:
        table = self._bpf[b"events"]

        def callback(_ctx, data, _size):
            e = table.event(data)
            event = RawCrossNode(e.ts_ns, e.pid, e.tid, base.c_string(bytes(e.comm)),
                                 e.from_cpu, e.to_cpu, e.from_node, e.to_node)
            if not event.pid:
                pid, comm = _thread(e.tid, self._proc)
                event = replace(event, pid=pid, comm=event.comm or comm)
            on_event(event)

        table.open_ring_buffer(callback)

    def read_counts(self) -> dict[int, RawMigrations]:
        """tid -> migrations since the last read (threads that did not move are left out)."""
        counts = self._bpf[b"counts"]
        result: dict[int, RawMigrations] = {}
        seen: dict[int, tuple[int, int]] = {}
        gone = []
        for key, c in counts.items():
            tid = key.value
            migrations, cross = c.migrations, c.cross_node
            before_m, before_x = self._seen.get(tid, (0, 0))
            if migrations < before_m:  # the entry was deleted and restarted in between
                before_m, before_x = 0, 0
            if c.exited:
                gone.append(key)
            else:
                seen[tid] = (migrations, cross)
            if migrations > before_m:
                pid, comm = c.pid, base.c_string(bytes(c.comm))
                if not pid or not comm:
                    live_pid, live_comm = _thread(tid, self._proc)
                    pid, comm = pid or live_pid, comm or live_comm
                result[tid] = RawMigrations(pid, tid, comm, migrations - before_m,
                                            max(0, cross - before_x), c.last_cpu)
        for key in gone:  # read one last time above; free the slot
            try:
                del counts[key]
            except KeyError:
                pass
        self._seen = seen
        return result
