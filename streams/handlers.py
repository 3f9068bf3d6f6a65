# SPDX-License-Identifier: Apache-2.0
"""The topic -> handler table: each input topic's records go to the rules of
their signal (streams/rules/<signal>.py), with the host state those rules
need; a sampled finding's repeats are dropped as streams/alert_groups.py
says (``Cooldowns``).

The table comes from the signal catalogue (schemas/signals.py): a signal's
handler is the method named after it, else the generic one over its rule
module's ``judge`` (``_rule_handler``: what a new signal needs). A topic
without either (topology, device traffic, stacks) only feeds the host state
and the store; histograms only feed /metrics. Handlers hold no I/O and never
wait.

A run-queue wait is judged with its process record, its host's topology and,
when a quota cgroup is known above it, the throttling record that covers its
end. A wait whose records are all known is judged at once; the others are
parked (streams/parking.py) and the handler returns without waiting: a
record of their host (``WAKING``) or their deadline (``due()``, from the
worker's timer) judges them, and ``flush()`` judges every parked wait with
what is known before the worker stops or hands partitions over.
"""

from __future__ import annotations

from collections import defaultdict
import importlib
import time
from typing import Awaitable, Callable, Iterable

from prometheus_client import Counter

from jitterscope.schemas import events, signals, topics
from jitterscope.streams.rules import blockio, gpu_ioctl, migrate, pages, runq
from jitterscope.streams.rules import processes as process_rules
from jitterscope.streams.rules import irq as irq_rules
from jitterscope.streams.rules import nvml as nvml_rules
from jitterscope.streams.rules import xid as xid_rules
from jitterscope.streams.rules import throttle as throttle_rules
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.rules.losses import LossWatch
from jitterscope.streams import signal_metrics
from jitterscope.streams.alert_groups import Audience, Cooldowns, quieted
from jitterscope.streams.parking import MAX_PARKED, WAKING, ParkedWaits
from jitterscope.streams.throttle_index import ThrottleIndex, contains

Handler = Callable[[list, int], Awaitable[list[events.Alert]]]

#: the topics whose records are evidence for request attribution (Attributor.add_evidence), in one
#: place: ``handle`` feeds them before judging, and ``feed`` alone is the store stage's share (streams/stages.py)
EVIDENCE = frozenset({topics.RUNQ, topics.IRQ, topics.CGROUP_THROTTLE, topics.GPU_IOCTL, topics.GPU_XID,
                      topics.GPU_TELEMETRY, topics.BLOCKED, topics.PAGES})

NO_INTERVAL = Counter("jitterscope_streams_records_without_interval_total",
                      "records whose interval_ns is 0, skipped by every rule (a rate over no time means nothing)",
                      ["topic"])


class Handlers:
    """``state``: the worker's HostState (or anything with its look-ups);
    ``attributor``: gets the kernel evidence and request spans (None: not
    attributing); ``clock``: monotonic seconds, for the parked waits'
    deadlines; ``max_parked``: how many run-queue waits may be parked."""

    def __init__(self, state, thresholds: Thresholds | None = None, attributor=None,
                 clock: Callable[[], float] = time.monotonic, max_parked: int = MAX_PARKED,
                 audience: Audience | None = None):
        self.state = state
        self.t = thresholds or Thresholds.defaults()
        self.audience = audience or Audience()
        self.attributor = attributor
        self.losses = LossWatch(self.t.loss_alert_events)
        self.cooldowns = Cooldowns()  # repeats of sampled findings (streams/alert_groups.py)
        self.throttles = ThrottleIndex()
        self.clock = clock
        self.parking = ParkedWaits(state, self.throttles, self._judge, clock, max_parked)
        #: input topic -> its signal's handler (schemas/signals.py)
        self.table: dict[str, Handler] = {}
        for signal in signals.SIGNALS:
            method = getattr(self, signal.name, None)
            handler = method if callable(method) else self._rule_handler(signal.name)
            if handler is not None:
                self.table[signal.topic] = handler

    async def handle(self, topic: str, records: list, now_ns: int) -> list[events.Alert]:
        handler = self.table.get(topic)
        if records and hasattr(records[0], "interval_ns"):  # one message holds one record type
            records = self._with_interval(topic, records)
        if self.attributor is not None:
            self._feed(topic, records)
        alerts = await handler(records, now_ns) if handler else []
        if topic in WAKING and self.parking:  # after the record's own alerts (a cgroup's quiet period)
            alerts += self.parking.wake({r.host for r in records})
        return alerts

    def feed(self, topic: str, records: list) -> None:
        """Only hand the records to the attributor, judging none: what a
        stage that attributes but does not judge (streams/stages.py) needs."""
        if records and hasattr(records[0], "interval_ns"):
            records = self._with_interval(topic, records)
        self._feed(topic, records)

    def _feed(self, topic: str, records: list) -> None:
        if topic == topics.REQUESTS:
            for span in records:
                self.attributor.add_request(span)
        elif topic in EVIDENCE:
            self.attributor.add_evidence_many(records)
        elif topic == topics.STACKS:  # the frames an attribution's culprit_stack names (its OTLP span)
            self.attributor.stacks.add(records)

    @staticmethod
    def _with_interval(topic: str, records: list) -> list:
        """A rate or share over no time is no finding (a collector's flush at
        stop once published histograms with interval 0, and the migration
        rule called that 8e9 moves a second): such records reach no rule and
        no attribution, and are counted."""
        kept = [r for r in records if r.interval_ns > 0]
        if len(kept) < len(records):
            NO_INTERVAL.labels(topic).inc(len(records) - len(kept))
        return kept

    def _judged(self, items: Iterable, judge: Callable, key: Callable[..., tuple]) -> list[events.Alert]:
        """The loop most signals share: each item's finding (``judge(item)``,
        with the look-ups it needs), kept unless it repeats one raised within
        its quiet period for the same ``key(item)``."""
        out = []
        for item in items:
            alert = judge(item)
            if self.cooldowns.fresh(alert, *key(item)):
                out.append(alert)
        return out

    def _rule_handler(self, name: str) -> Handler | None:
        """For a signal without a method here: its rule module's
        ``judge(record, state, thresholds, now_ns) -> Alert | None`` on each
        record, repeats kept apart by its ``repeat_key(record) -> tuple``
        (default: one per host and alert kind). None: no such module."""
        module_name = f"{__package__}.rules.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # the module is there, and something it imports is not
            return None
        judge = getattr(module, "judge", None)
        if judge is None:
            return None
        key = getattr(module, "repeat_key", lambda record: ())

        async def handle(records: list, now_ns: int) -> list[events.Alert]:
            return self._judged(records, lambda r: judge(r, self.state, self.t, now_ns), key)
        return handle

    async def runq(self, records: list[events.RunqEvent], now_ns: int) -> list[events.Alert]:
        """Judge every alert-worthy wait whose records are known; park the
        others (never waits: see the module's docstring)."""
        alert_ns = self.t.runq_alert_ns
        worthy = [e for e in records if e.wait_ns >= alert_ns]
        if not worthy:
            return []
        known, topology = self.state.processes, self.state.topology
        alerts: list[events.Alert] = []
        now = None
        for event in worthy:
            victim = known.get((event.host, event.pid))
            # the common case, answered with dict look-ups: a known process on a
            # known host in a cgroup without a quota
            if victim is not None and event.host in topology and not self.throttles.limited(event.host, victim):
                alert = self._judge(event, victim, limited=False)
            else:
                now = self.clock() if now is None else now
                self.parking.take(event, now, alerts)
                continue
            if alert:
                alerts.append(alert)
        return alerts

    @property
    def parked(self) -> int:
        """Run-queue waits parked now."""
        return len(self.parking)

    def due(self) -> list[events.Alert]:
        """Judge the parked waits whose deadline passed (the worker's short timer)."""
        return self.parking.due()

    def flush(self) -> list[events.Alert]:
        """Judge every parked wait now with what is known (the worker stops or hands partitions over)."""
        return self.parking.flush()

    def _judge(self, event: events.RunqEvent, victim, limited: bool | None = None) -> events.Alert | None:
        """The run-queue rule with what is known now; a throttled wait inside
        its cgroup's quiet period raises nothing (the cfs_throttling alert said it)."""
        if limited is None:
            limited = self.throttles.limited(event.host, victim)
        throttled = self.throttles.throttled(event.host, victim.cgroup, event.ts_ns - event.wait_ns, event.ts_ns) \
            if limited else []
        alert = runq.runq_starvation(event, self.t.runq_alert_ns, victim, self.state.host_cpus(event.host),
                                     time.time_ns(), throttled)
        if alert and (alert.kind != "cfs_throttling" or self.cooldowns.fresh(alert, alert.evidence.get("cgroup"))):
            return alert if self.audience.hears_of(victim) else quieted(alert)
        return None

    async def irq(self, records: list[events.IrqTime], now_ns: int) -> list[events.Alert]:
        """Interrupt time per CPU: charged to the request waits on that CPU,
        and an alert when one source takes a large share of a CPU."""
        def judge(r: events.IrqTime) -> events.Alert | None:
            serving = {c for (host, _), p in self.state.processes.items()
                       if host == r.host and (p.serving_group or p.gpus) for c in p.cpus_allowed}
            return irq_rules.irq_time(r, serving, self.state.host_cpus(r.host), self.t, now_ns)

        # most records are under the share: spare them the look-up
        heavy = (r for r in records if r.time_ns >= self.t.irq_share * r.interval_ns)
        return self._judged(heavy, judge, lambda r: (r.cpu, r.source))

    async def throttle(self, records: list[events.CgroupThrottle], now_ns: int) -> list[events.Alert]:
        """CFS throttling per cgroup: charged to the request waits of its
        processes, kept for the run-queue rule, and an alert when a cgroup
        holding a watched process was throttled."""
        for r in records:
            self.throttles.add(r)

        def judge(r: events.CgroupThrottle) -> events.Alert | None:
            holders = sorted((p for (host, _), p in self.state.processes.items()
                              if host == r.host and p.cgroup and contains(r.cgroup, p.cgroup)),
                             key=lambda p: (not p.serving_group, p.pid))  # a serving process first
            return throttle_rules.cfs_throttling(r, holders[0] if holders else None, self.t, now_ns)

        throttled = (r for r in records if r.throttled_ns >= self.t.cfs_throttle_ns)
        return self._judged(throttled, judge, lambda r: (r.cgroup,))

    async def histograms(self, records: list[events.LatencyHistogram], now_ns: int) -> list[events.Alert]:
        """Every latency the collectors measured: onto /metrics (streams/signal_metrics.py); no rule."""
        signal_metrics.observe(records)
        return []

    async def requests(self, spans: list[events.RequestSpan], now_ns: int) -> list[events.Alert]:
        """Spans wait for attribution (``feed``); rules/requests.py judges them when it is done."""
        return []

    async def collector_stats(self, stats: list[events.CollectorStats], now_ns: int) -> list[events.Alert]:
        return [a for a in map(self.losses.judge, stats) if a]

    async def gpu_ioctl(self, calls: list[events.GpuIoctl], now_ns: int) -> list[events.Alert]:
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

    async def xid(self, records: list[events.GpuXid], now_ns: int) -> list[events.Alert]:
        """An alert per Xid (rules/xid.py); the requests on its GPU then name it."""
        return self._gpu_reports(records, xid_rules, now_ns)

    async def nvml(self, records: list[events.GpuTelemetry], now_ns: int) -> list[events.Alert]:
        """An alert per GPU clocked down (rules/nvml.py); the requests on it then name the reasons."""
        return self._gpu_reports(records, nvml_rules, now_ns)

    def _gpu_reports(self, records: list, rules, now_ns: int) -> list[events.Alert]:
        return self._judged(records, lambda r: rules.judge(r, self.state, self.t, now_ns), rules.repeat_key)

    async def blocked(self, waits: list[events.BlockedWait], now_ns: int) -> list[events.Alert]:
        """Blocked time is evidence for the requests it overlapped (their
        time budget); it raises no alert of its own: a serving thread waiting
        for its next request is blocked too."""
        return []

    async def processes(self, records: list[events.ProcessInfo], now_ns: int) -> list[events.Alert]:
        def judge(process: events.ProcessInfo) -> events.Alert | None:
            topo = self.state.topology.get(process.host)
            return process_rules.cpu_off_gpu_node(process, topo, now_ns) if topo and process.gpus else None

        return self._judged(records, judge, lambda p: (p.pid,))

    async def migrate(self, records: list[events.Migrations], now_ns: int) -> list[events.Alert]:
        return self._judged(records, lambda m: migrate.migration_storm(
            m, self.state.processes.get((m.host, m.pid)), self.state.topology.get(m.host), self.t, now_ns),
            lambda m: (m.tid,))

    async def pages(self, placements: list[events.PagePlacement], now_ns: int) -> list[events.Alert]:
        """One collector interval's placements arrive together: judge each
        process over all its nodes at once."""
        by_process: dict[tuple[str, int], list[events.PagePlacement]] = defaultdict(list)
        for p in placements:
            by_process[(p.host, p.pid)].append(p)
        out = []
        fillers = self._node_fillers(placements)
        for (host, pid), group in by_process.items():
            topo = self.state.topology.get(host)
            if topo is None:
                continue
            process = self.state.processes.get((host, pid))
            if process and process.gpus:
                alert = pages.remote_memory(process, group, topo, self.t, now_ns, fillers.get(host))
                if alert is not None and self.cooldowns.fresh(alert, pid):
                    out.append(alert)
                continue
            users = self.state.gpu_users(host)
            for placement in group:
                alert = pages.node_filler(placement, process, topo, users, self.t, now_ns)
                if alert is not None and self.cooldowns.fresh(alert, pid, placement.node):
                    out.append(alert)
        return out

    def _node_fillers(self, placements: list[events.PagePlacement]) -> dict[str, dict[int, events.PagePlacement]]:
        """host -> node -> the placement that added the most page cache there
        among the processes that serve no GPU (who filled an inference
        process's own node, pushing its pages to the other)."""
        out: dict[str, dict[int, events.PagePlacement]] = defaultdict(dict)
        for p in placements:
            process = self.state.processes.get((p.host, p.pid))
            best = out[p.host].get(p.node)
            if not (process and process.gpus) and (best is None or p.page_cache_pages > best.page_cache_pages):
                out[p.host][p.node] = p
        return out
