"""Applies the hardware rules to each decoded batch, with the host state they
need, and keeps repeated findings from flooding the alert topic."""

from __future__ import annotations

from collections import defaultdict

from jitterscope.schemas import events, topics
from jitterscope.streams import hardware_rules as rules

#: how long the same finding about the same process/thread stays quiet
REPEAT_AFTER_NS = {
    "numa_cpu_mismatch": 600_000_000_000,
    "numa_remote_memory": 300_000_000_000,
    "numa_node_filler": 60_000_000_000,
    "migration_storm": 60_000_000_000,
}


class HardwareJudge:
    def __init__(self, state, thresholds: rules.Thresholds = rules.Thresholds()):
        self.state = state
        self.t = thresholds
        self._last: dict[tuple, int] = {}

    def _fresh(self, alert: events.Alert | None, *key) -> bool:
        """False for a finding already raised within its quiet period."""
        if alert is None:
            return False
        quiet = REPEAT_AFTER_NS.get(alert.kind, 0)
        ident = (alert.kind, alert.host, *key)
        if quiet and alert.raised_ns - self._last.get(ident, -quiet) < quiet:
            return False
        self._last[ident] = alert.raised_ns
        return True

    def judge(self, topic: str, records: list, now_ns: int) -> list[events.Alert]:
        judge = {
            topics.GPU_IOCTL: self._gpu_ioctls,
            topics.PROCESSES: self._processes,
            topics.MIGRATIONS: self._migrations,
            topics.PAGES: self._pages,
        }.get(topic)
        return judge(records, now_ns) if judge else []

    def _gpu_ioctls(self, calls: list[events.GpuIoctl], now_ns: int) -> list[events.Alert]:
        out = []
        for call in calls:
            process = self.state.processes.get((call.host, call.pid))
            topo = self.state.topology.get(call.host)
            contention = rules.pcie_contention(call, process, topo, self.state.host_traffic(call.host), self.t, now_ns)
            alert = contention or rules.gpu_ioctl_stall(call, process, topo, self.t, now_ns)
            if alert:
                out.append(alert)
        return out

    def _processes(self, processes: list[events.ProcessInfo], now_ns: int) -> list[events.Alert]:
        out = []
        for process in processes:
            topo = self.state.topology.get(process.host)
            alert = rules.cpu_off_gpu_node(process, topo, now_ns) if topo and process.gpus else None
            if self._fresh(alert, process.pid):
                out.append(alert)
        return out

    def _migrations(self, records: list[events.Migrations], now_ns: int) -> list[events.Alert]:
        out = []
        for m in records:
            alert = rules.migration_storm(m, self.state.processes.get((m.host, m.pid)),
                                          self.state.topology.get(m.host), self.t, now_ns)
            if self._fresh(alert, m.tid):
                out.append(alert)
        return out

    def _pages(self, placements: list[events.PagePlacement], now_ns: int) -> list[events.Alert]:
        """One collector interval's placements arrive together: judge each
        process over all its nodes at once."""
        by_process: dict[tuple[str, int], list[events.PagePlacement]] = defaultdict(list)
        for p in placements:
            by_process[(p.host, p.pid)].append(p)
        out = []
        for (host, pid), group in by_process.items():
            topo = self.state.topology.get(host)
            if topo is None:
                continue
            process = self.state.processes.get((host, pid))
            if process and process.gpus:
                alert = rules.remote_memory(process, group, topo, self.t, now_ns)
                if self._fresh(alert, pid):
                    out.append(alert)
                continue
            users = self.state.gpu_users(host)
            for placement in group:
                alert = rules.node_filler(placement, process, topo, users, self.t, now_ns)
                if self._fresh(alert, pid, placement.node):
                    out.append(alert)
        return out
