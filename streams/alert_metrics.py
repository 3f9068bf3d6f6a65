# SPDX-License-Identifier: Apache-2.0
"""The alerts raised, on /metrics: how many of each kind, and how long after
the event it is about each was raised. Counted where alerts are raised: the
rules judging a message or a parked run-queue wait (streams/app.py) and the
attribution tick (streams/attribution_tick.py)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from jitterscope.schemas import events

ALERTS = Counter("jitterscope_streams_alerts_total", "alerts raised", ["kind"])
#: kernel event (or request end) to alert raised: what an operator waits for an alert
ALERT_DELAY = Histogram(
    "jitterscope_streams_alert_delay_seconds", "alert raised minus the time of the event it is about (its ts)",
    ["kind"], buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                       7.5, 10.0))


def count_raised(alerts: list[events.Alert]) -> None:
    """Count new alerts, and how long after their event each was raised (a
    clock behind the collector's counts as 0)."""
    for alert in alerts:
        ALERTS.labels(alert.kind).inc()
        ALERT_DELAY.labels(alert.kind).observe(max(0, alert.raised_ns - alert.ts_ns) / 1e9)
