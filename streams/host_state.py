# SPDX-License-Identifier: Apache-2.0
"""What the worker knows about the hosts it owns: the latest topology,
process records and device traffic, kept in plain per-worker dicts.

Not Faust Tables: collectors re-publish topology and process records every
minute and the worker primes the dicts from ClickHouse at start, so a
changelog topic would add recovery time (and, on Tansu, lossy restores
through its under-reported high-water marks) for state that is re-sent
anyway. Every topic is keyed by host, so the worker that sees a host's
events also sees its metadata.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
import time
from typing import Protocol

from jitterscope.schemas import events
from jitterscope.streams import clickhouse



class ProcessBook(Protocol):
    """What the attributor asks of the host state (streams/attribution.py)."""

    processes: dict[tuple[str, int], events.ProcessInfo]

    def serving_group(self, host: str, pid: int) -> set[int]: ...


PROCESS_WAIT_S = 1.0  # how long an alert waits for its process (and a new host's topology) record to arrive


class HostState:
    """What the worker knows about the hosts it owns: the latest topology,
    process records and device traffic."""

    def __init__(self):
        self.topology: dict[str, events.Topology] = {}
        self._topology_until: dict[str, float] = {}  # host -> end of its one wait for a topology record
        self.processes: dict[tuple[str, int], events.ProcessInfo] = {}
        # per-host indexes, so per-event look-ups do not scan the whole fleet
        self._host_processes: dict[str, dict[int, events.ProcessInfo]] = defaultdict(dict)
        # host -> span process -> the processes of its serving group (ProcessInfo.serving_group)
        self._groups: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
        self._traffic: dict[str, dict[str, events.DeviceIo]] = defaultdict(dict)  # host -> PCI address -> latest

    def learn(self, record: events.Record) -> None:
        if isinstance(record, events.Topology):
            self.topology[record.host] = record
        elif isinstance(record, events.ProcessInfo):
            before = self.processes.get((record.host, record.pid))
            if before and before.serving_group and before.serving_group != record.serving_group:
                self._groups[record.host][before.serving_group].discard(record.pid)
            if record.serving_group:
                self._groups[record.host][record.serving_group].add(record.pid)
            self.processes[(record.host, record.pid)] = record
            self._host_processes[record.host][record.pid] = record
        elif isinstance(record, events.DeviceIo) and record.pci:
            self._traffic[record.host][record.pci] = record

    def host_cpus(self, host: str) -> list[int] | None:
        topo = self.topology.get(host)
        return topo.cpus if topo else None

    def topology_due(self, host: str, now: float, wait_s: float = PROCESS_WAIT_S) -> float | None:
        """For a host whose topology is not known yet: until when (``now``'s
        clock, monotonic seconds) to wait for its record (the collector sends
        it first, on another topic). The first ask opens the host's one
        window, so a host that never sends one costs one wait. None: known,
        or its window is over. Never waits itself (streams/handlers.py parks)."""
        if host in self.topology:
            return None
        until = self._topology_until.setdefault(host, now + wait_s)
        return until if now < until else None

    async def cpus(self, host: str, wait_s: float = PROCESS_WAIT_S) -> list[int] | None:
        """The host's CPUs, waiting within the host's one window
        (``topology_due``) for its topology record. For callers that may
        wait: the run-queue handler does not (it parks)."""
        while self.topology_due(host, time.monotonic(), wait_s) is not None:
            await asyncio.sleep(0.05)
        return self.host_cpus(host)

    def gpu_users(self, host: str) -> dict[str, list[str]]:
        """GPU address -> names of the processes that have it open."""
        users: dict[str, list[str]] = {}
        for process in self._host_processes.get(host, {}).values():
            for gpu in process.gpus:
                users.setdefault(gpu, []).append(process.comm)
        return users

    def serving_group(self, host: str, pid: int) -> set[int]:
        """The processes whose evidence counts for the requests ``pid``
        sends: its serving group as the collector found it, itself included.
        A member that exited stays until its pid is described again: its
        old evidence ages out of the attributor's horizon anyway."""
        group = self._groups.get(host, {}).get(pid)
        return {pid, *group} if group else {pid}

    def host_traffic(self, host: str) -> dict[str, events.DeviceIo]:
        return self._traffic.get(host, {})

    async def process(self, host: str, pid: int, wait_s: float = PROCESS_WAIT_S) -> events.ProcessInfo | None:
        """The process's metadata; waits briefly, since the collector's
        process record travels on another topic and may arrive just after.
        For callers that may wait: the run-queue handler does not (it parks)."""
        deadline = time.monotonic() + wait_s
        while (found := self.processes.get((host, pid))) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return found

    def prime(self, client) -> None:
        """Latest topology per host and record per process of the last day."""
        day = "ts > now() - INTERVAL 1 DAY"
        latest_topology = (f"(host, ts) IN (SELECT host, max(ts) FROM {clickhouse.DATABASE}.topology "
                           f"WHERE {day} GROUP BY host)")
        for topo in clickhouse.select_records(client, events.Topology, latest_topology):
            self.learn(topo)
        latest_process = (f"(host, pid, ts) IN (SELECT host, pid, max(ts) FROM {clickhouse.DATABASE}.processes "
                          f"WHERE {day} GROUP BY host, pid)")
        for process in clickhouse.select_records(client, events.ProcessInfo, latest_process):
            self.learn(process)
