# SPDX-License-Identifier: Apache-2.0
"""CPU migrations per thread, cross-node ones apart (bpf/migrate.bpf.c), and
the "migrate" signal built on it.

The kernel counts every migration per thread; `read_counts` turns the
cumulative counters into deltas since the previous read. Moves to another
NUMA node (per the cpu -> node map the collector gives, from the host's
topology) are counted apart in the same per-thread entry, and published as
``events.Migrations.cross_node``.

Cross-node moves do not leave the kernel one by one. They used to go through
a ring buffer, and the collector decoded each and threw it away: every
consumer (the migration rules, the migrations table, the report) reads the
per-thread count, which already says how many moves crossed a node and who
made them. A per-move record would need a new record type and table for a
question no rule asks yet (which node to which, when exactly), and would cost
a ring-buffer reservation on a scheduler tracepoint. Stopping the events
saves that work in the kernel and a decode per move here; should a rule ever
need the moves themselves, it gets a record type of its own then.

The tracepoint fires in the migrating context, not the migrated thread's, so
the kernel learns each thread's tgid and name at clone and rename; threads
older than the probe are seeded from /proc for target processes, and any
thread the kernel does not know (pid 0 in its records) is resolved from
/proc here.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from jitterscope.collector.probes import base
from jitterscope.collector.probes.base import UNKNOWN_NODE, delete_keys, map_items
from jitterscope.collector.probes.interface import BccSignal, ProbeContext
from jitterscope.schemas import events


@dataclass(frozen=True)
class RawMigrations:
    """One thread's migrations since the previous read."""

    pid: int            # tgid, 0 when neither the kernel nor /proc knows it any more
    tid: int
    comm: str
    migrations: int
    cross_node: int     # of which moved it to another NUMA node
    last_cpu: int       # where the last migration put it


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
        current = {k.value for k in self._bpf[b"targets"].keys()}
        refused = self.set_entries(b"targets", dict.fromkeys(wanted, 1))
        self._seed(wanted - current - refused)
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
                    leaf.comm = comm.encode()[:base.TASK_COMM_LEN - 1]
                    tasks[tasks.Key(tid)] = leaf

    def poll(self, timeout_ms: int = 0) -> None:
        """Nothing leaves this program one by one (see the module doc)."""

    def read_counts(self) -> dict[int, RawMigrations]:
        """tid -> migrations since the last read (threads that did not move are left out)."""
        counts = self._bpf[b"counts"]
        result, self._seen, gone = diff_counts(map_items(counts), self._seen, self._proc)
        delete_keys(counts, gone)  # read one last time; free the slot
        return result


def diff_counts(entries, seen: dict[int, tuple[int, int]], proc: Path = Path("/proc")
                ) -> tuple[dict[int, RawMigrations], dict[int, tuple[int, int]], list]:
    """The kernel's cumulative ``counts`` entries ((tid key, struct
    migrate_counts) pairs, bpf/migrate.h) as deltas against ``seen`` (tid ->
    (migrations, cross_node) already reported). Returns the deltas, the new
    ``seen``, and the keys of exited threads (read one last time here, for the
    caller to delete)."""
    result: dict[int, RawMigrations] = {}
    now_seen: dict[int, tuple[int, int]] = {}
    gone = []
    for key, c in entries:
        tid = key.value
        migrations, cross = c.migrations, c.cross_node
        before_m, before_x = seen.get(tid, (0, 0))
        if migrations < before_m:  # the entry was deleted and restarted in between
            before_m, before_x = 0, 0
        if c.exited:
            gone.append(key)
        else:
            now_seen[tid] = (migrations, cross)
        if migrations > before_m:
            pid, comm = c.pid, base.c_string(bytes(c.comm))
            if not pid or not comm:
                live_pid, live_comm = _thread(tid, proc)
                pid, comm = pid or live_pid, comm or live_comm
            result[tid] = RawMigrations(pid, tid, comm, migrations - before_m,
                                        max(0, cross - before_x), c.last_cpu)
    return result, now_seen, gone


class MigrateSignal(BccSignal):
    """CPU migrations per thread (the watched processes' threads when
    targets are filtered), cross-node ones counted apart."""

    name = "migrate"
    publishes = (events.Migrations,)

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        cpu_node = {c.cpu: c.node for c in context.topology["cpu_info"]}
        self.probe = MigrationProbe(cpu_node, context.targets, context.proc)

    def set_targets(self, targets: set[int] | None, thresholds: dict[int, int]) -> None:
        if self.probe and targets is not None:
            self.probe.set_targets(targets)

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        if not self.probe:
            return []
        records = []
        for tid, m in sorted(self.probe.read_counts().items()):
            self.ctx.describe_process(m.pid)
            records.append(self.ctx.record(
                events.Migrations, now_ns, pid=m.pid, tid=m.tid, comm=m.comm, interval_ns=interval_ns,
                migrations=m.migrations, cross_node=m.cross_node, last_cpu=m.last_cpu))
        return records
