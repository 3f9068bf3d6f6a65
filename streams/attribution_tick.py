# SPDX-License-Identifier: Apache-2.0
"""The streams worker's attribution tick: every ATTRIBUTION_TICK_S
(streams/app.py) the requests whose grace period is over are attributed
(streams/attribution.py), those over their SLO raise request_slo alerts
(streams/rules/requests.py), and the attributions are published to the
attribution topic, then stored with their alerts (streams/store_path.py).

``AttributionTick`` is mixed into the worker (streams/app.py), which gives it
its attributor, its host state, the attribution topic, ``publish`` and
``announce_alerts`` (streams/app.py) and ``store`` (streams/store_path.py).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

from prometheus_client import Counter, Gauge

from jitterscope.schemas import topics
from jitterscope.streams.alert_metrics import count_raised
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.host_state import HostState
from jitterscope.streams.otlp_export import AttributionExport
from jitterscope.streams.rules.requests import request_slo
from jitterscope.streams.store_path import Decoded

ATTRIBUTIONS = Counter("jitterscope_streams_attributions_total", "requests attributed")
PENDING_REQUESTS = Gauge("jitterscope_streams_pending_requests", "requests waiting for their grace period")
COLUMNAR_FAILURES = Counter("jitterscope_streams_columnar_index_failures_total",
                            "attribution batches the columnar index failed on, answered by the row-wise one (a bug)")
LATE_EVIDENCE = Counter("jitterscope_streams_late_evidence_total",
                        "kernel evidence that arrived after requests it overlapped were attributed")


class AttributionTick:
    """The worker's attribution step (mixed into StreamsWorker)."""

    attributor: Attributor
    state: HostState
    attribution_topic: Any  # a Faust topic
    exporter: AttributionExport
    stage: str
    held_requests: Any  # streams/attribution_stage.py's HeldRequests
    _late_counted: int  # the attributor's late evidence already counted in LATE_EVIDENCE
    _columnar_counted: int  # and its columnar failures in COLUMNAR_FAILURES
    attributions_sent: int
    # streams/app.py and streams/store_path.py
    publish: Callable[..., Awaitable[None]]
    announce_alerts: Callable[..., Awaitable[list]]
    keep_alerts: Callable[..., Awaitable[None]]
    store: Callable[..., Awaitable[None]]

    async def attribute_due(self, now_ns: int) -> None:
        """Attribute the requests whose grace period is over; publish, store
        and alert on them. In the attribution stage the store stage stores
        them, and their request messages are acked once published."""
        done = self.attributor.due(now_ns)
        PENDING_REQUESTS.set(self.attributor.pending)
        LATE_EVIDENCE.inc(self.attributor.late_evidence - self._late_counted)  # its running total, as a Counter
        self._late_counted = self.attributor.late_evidence
        COLUMNAR_FAILURES.inc(self.attributor.columnar_failures - self._columnar_counted)
        self._columnar_counted = self.attributor.columnar_failures
        if not done:
            return
        ATTRIBUTIONS.inc(len(done))
        alerts = []
        for a in done:
            process = self.state.processes.get((a.host, a.pid))
            culprits = self.attributor.culprits(a)
            alert = request_slo(a, process.comm if process else "", process.cpus_allowed if process else [],
                                self.state.host_cpus(a.host), time.time_ns(), culprits.throttle, culprits.irq)
            if alert:
                alerts.append(alert)
        count_raised(alerts)
        await self.publish(self.attribution_topic, done)
        self.exporter.offer(done, self.attributor.stacks.get)  # only queues (streams/otlp_export.py)
        self.attributions_sent += len(done)
        alerts = await self.announce_alerts(alerts)
        if self.stage in ("all", "attribute-store"):  # its own store (the attribution stage publishes them)
            await self.store(topics.ATTRIBUTION, "request_attribution", [Decoded(done, [], alerts)])
            return
        await self.keep_alerts(alerts)  # the alert-rows topic: the store stage stores them with the attributions
        for ack in self.held_requests.release([(a.host, a.boot_id, a.seq) for a in done]):
            await ack

