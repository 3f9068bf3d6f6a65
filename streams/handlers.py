"""The topic -> handler table: each input topic's records go to the rules of
their signal (streams/rules/<signal>.py), with the host state those rules
need, and repeated findings are kept from flooding the alert topic.

A topic without a handler (topology, device traffic) only feeds the host
state and the store; histograms only feed /metrics. Handlers hold no I/O beyond waiting briefly
for a process record that travels on another topic.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
import time
from typing import Awaitable, Callable

from jitterscope.schemas import events, topics
from jitterscope.streams.rules import blockio, gpu_ioctl, migrate, pages, processes, runq
from jitterscope.streams.rules import irq as irq_rules
from jitterscope.streams.rules import throttle
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.rules.losses import LossWatch
from jitterscope.streams import signal_metrics
from jitterscope.streams.throttle_index import ThrottleIndex, contains

#: how long the same finding about the same process/thread stays quiet
REPEAT_AFTER_NS = {
    "numa_cpu_mismatch": 600_000_000_000,
    "numa_remote_memory": 300_000_000_000,
    "numa_node_filler": 60_000_000_000,
    "migration_storm": 60_000_000_000,
    "irq": 60_000_000_000,  # per (CPU, source): a storm lasts; one alert a minute says so
    "cfs_throttling": 60_000_000_000,  # per cgroup: a quota too small throttles every period
}

Handler = Callable[[list, int], Awaitable[list[events.Alert]]]

#: how long a run-queue wait in a quota cgroup waits for the throttling
#: record that covers it (the cfs sampler publishes every cfs_interval_s,
#: then the batch delay): judged without it after that
THROTTLE_WAIT_S = 2.0


class Handlers:
    """``state``: the worker's HostState (or anything with its look-ups);
    ``attributor``: gets the kernel evidence and request spans (None: not
    attributing)."""

    def __init__(self, state, thresholds: Thresholds | None = None, attributor=None):
        self.state = state
        self.t = thresholds or Thresholds.defaults()
        self.attributor = attributor
        self.losses = LossWatch(self.t.loss_alert_events)
        self._last: dict[tuple, int] = {}
        self.throttles = ThrottleIndex()
        #: input topic -> its signal's handler
        self.table: dict[str, Handler] = {
            topics.RUNQ: self.runq,
            topics.REQUESTS: self.requests,
            topics.COLLECTOR_STATS: self.collector_stats,
            topics.GPU_IOCTL: self.gpu_ioctl,
            topics.PROCESSES: self.processes,
            topics.MIGRATIONS: self.migrations,
            topics.PAGES: self.pages,
            topics.IRQ: self.irq,
            topics.CGROUP_THROTTLE: self.cgroup_throttle,
            topics.HISTOGRAMS: self.histograms,
        }

    async def handle(self, topic: str, records: list, now_ns: int) -> list[events.Alert]:
        handler = self.table.get(topic)
        return await handler(records, now_ns) if handler else []

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

    async def runq(self, records: list[events.RunqEvent], now_ns: int) -> list[events.Alert]:
        if self.attributor is not None:
            self.attributor.add_evidence_many(records)
        alert_ns = self.t.runq_alert_ns
        worthy = [e for e in records if e.wait_ns >= alert_ns]
        if not worthy:
            return []
        # Known processes and unlimited cgroups are answered here: a task per
        # alert-worthy event (asyncio.gather) costs more than the rule itself.
        known = self.state.processes
        victims = {key: known.get(key) for key in sorted({(e.host, e.pid) for e in worthy})}
        if missing := [key for key, found in victims.items() if found is None]:
            victims.update(zip(missing, await asyncio.gather(*(self.state.process(h, p) for h, p in missing))))
        hosts = sorted({e.host for e in worthy})
        cpus = dict(zip(hosts, await asyncio.gather(*(self.state.cpus(h) for h in hosts))))
        throttles: list[list[events.CgroupThrottle]] = [[] for _ in worthy]
        limited = [(i, e, victims[(e.host, e.pid)]) for i, e in enumerate(worthy)
                   if self._limited(e, victims[(e.host, e.pid)])]
        found = await asyncio.gather(*(self._throttled(e, victim) for _, e, victim in limited))
        for (i, _, _), covering in zip(limited, found):
            throttles[i] = covering
        alerts = []
        for event, throttled in zip(worthy, throttles):
            alert = runq.runq_starvation(event, alert_ns, victims[(event.host, event.pid)],
                                         cpus[event.host], time.time_ns(), throttled)
            if alert and (alert.kind != "cfs_throttling" or self._fresh(alert, alert.evidence.get("cgroup"))):
                alerts.append(alert)
        return alerts

    def _limited(self, event: events.RunqEvent, victim) -> bool:
        """Whether a quota cgroup is known above the waiting thread."""
        cgroup = getattr(victim, "cgroup", "")
        return bool(cgroup and self.throttles.limits(event.host, cgroup))

    async def _throttled(self, event: events.RunqEvent, victim) -> list[events.CgroupThrottle]:
        """Throttling of the quota cgroups above the waiting thread during its
        wait; when its cgroup has a quota, waits briefly for the record that
        covers the wait's end (it travels on another topic)."""
        if not self._limited(event, victim):
            return []
        cgroup = victim.cgroup
        deadline = time.monotonic() + THROTTLE_WAIT_S
        while self.throttles.covered_until(event.host, cgroup) < event.ts_ns and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.throttles.throttled(event.host, cgroup, event.ts_ns - event.wait_ns, event.ts_ns)

    async def irq(self, records: list[events.IrqTime], now_ns: int) -> list[events.Alert]:
        """Interrupt time per CPU: charged to the request waits on that CPU,
        and an alert when one source takes a large share of a CPU."""
        if self.attributor is not None:
            for record in records:
                self.attributor.add_evidence(record)
        out = []
        for r in records:
            if r.time_ns < self.t.irq_share * r.interval_ns:
                continue  # most records: spare them the look-up below
            serving = {c for (host, _), p in self.state.processes.items()
                       if host == r.host and (p.serving_group or p.gpus) for c in p.cpus_allowed}
            alert = irq_rules.irq_time(r, serving, self.state.host_cpus(r.host), self.t, now_ns)
            if self._fresh(alert, r.cpu, r.source):
                out.append(alert)
        return out

    async def cgroup_throttle(self, records: list[events.CgroupThrottle], now_ns: int) -> list[events.Alert]:
        """CFS throttling per cgroup: charged to the request waits of its
        processes, kept for the run-queue rule, and an alert when a cgroup
        holding a watched process was throttled."""
        if self.attributor is not None:
            for record in records:
                self.attributor.add_evidence(record)
        out = []
        for r in records:
            self.throttles.add(r)
            if r.throttled_ns < self.t.cfs_throttle_ns:
                continue
            holders = sorted((p for (host, _), p in self.state.processes.items()
                              if host == r.host and p.cgroup and contains(r.cgroup, p.cgroup)),
                             key=lambda p: (not p.serving_group, p.pid))  # a serving process first
            alert = throttle.cfs_throttling(r, holders[0] if holders else None, self.t, now_ns)
            if self._fresh(alert, r.cgroup):
                out.append(alert)
        return out

    async def histograms(self, records: list[events.LatencyHistogram], now_ns: int) -> list[events.Alert]:
        """Every latency the collectors measured: onto /metrics (streams/signal_metrics.py); no rule."""
        signal_metrics.observe(records)
        return []

    async def requests(self, spans: list[events.RequestSpan], now_ns: int) -> list[events.Alert]:
        """Spans wait for attribution; rules/requests.py judges them when it is done."""
        if self.attributor is not None:
            for span in spans:
                self.attributor.add_request(span)
        return []

    async def collector_stats(self, stats: list[events.CollectorStats], now_ns: int) -> list[events.Alert]:
        return [a for a in map(self.losses.judge, stats) if a]

    async def gpu_ioctl(self, calls: list[events.GpuIoctl], now_ns: int) -> list[events.Alert]:
        if self.attributor is not None:
            for call in calls:
                self.attributor.add_evidence(call)
        out = []
        for call in calls:
            process = self.state.processes.get((call.host, call.pid))
            topo = self.state.topology.get(call.host)
            contention = blockio.pcie_contention(call, process, topo, self.state.host_traffic(call.host), self.t,
                                                 now_ns)
            alert = contention or gpu_ioctl.gpu_ioctl_stall(call, process, topo, self.t, now_ns)
            if alert:
                out.append(alert)
        return out

    async def processes(self, records: list[events.ProcessInfo], now_ns: int) -> list[events.Alert]:
        out = []
        for process in records:
            topo = self.state.topology.get(process.host)
            alert = processes.cpu_off_gpu_node(process, topo, now_ns) if topo and process.gpus else None
            if self._fresh(alert, process.pid):
                out.append(alert)
        return out

    async def migrations(self, records: list[events.Migrations], now_ns: int) -> list[events.Alert]:
        out = []
        for m in records:
            alert = migrate.migration_storm(m, self.state.processes.get((m.host, m.pid)),
                                            self.state.topology.get(m.host), self.t, now_ns)
            if self._fresh(alert, m.tid):
                out.append(alert)
        return out

    async def pages(self, placements: list[events.PagePlacement], now_ns: int) -> list[events.Alert]:
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
                alert = pages.remote_memory(process, group, topo, self.t, now_ns)
                if self._fresh(alert, pid):
                    out.append(alert)
                continue
            users = self.state.gpu_users(host)
            for placement in group:
                alert = pages.node_filler(placement, process, topo, users, self.t, now_ns)
                if self._fresh(alert, pid, placement.node):
                    out.append(alert)
        return out
