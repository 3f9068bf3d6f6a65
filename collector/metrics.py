# SPDX-License-Identifier: Apache-2.0
"""The collector's own Prometheus metrics (its /metrics), fed from the parts'
running totals (collector/agent.py ``export_metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS_READ = Counter("jitterscope_collector_events_read_total", "kernel events read from ring buffers", ["probe"])
# Counters (rate() and resets work), fed from the parts' own running totals by _Exported
RECORDS_SENT = Counter("jitterscope_collector_records_sent_total", "records acknowledged by Kafka", ["topic"])
DELIVERY_ERRORS = Counter("jitterscope_collector_delivery_errors_total",
                          "Kafka messages that failed delivery (then spooled or, if permanent, dropped)")
RINGBUF_DROPS = Counter("jitterscope_collector_ringbuf_drops_total",
                        "events dropped in the kernel (ring buffer full)", ["probe"])
SPOOL_DROPS = Counter("jitterscope_collector_spool_drops_total",
                      "records dropped: Kafka could not take them and the on-disk spool was full or off")
PRODUCER_RESTARTS = Counter("jitterscope_collector_producer_restarts_total",
                            "Kafka producers recreated after a fatal error or a stall")
OWN_WAITS_SKIPPED = Counter("jitterscope_collector_own_waits_skipped_total",
                            "run-queue waits of jitterscope's own processes, not published (no user's alert)")
MAP_FULL_DROPS = Counter("jitterscope_collector_map_full_drops_total",
                         "in-kernel map updates that failed (map full): state the probes lost")
SPOOLED = Gauge("jitterscope_collector_spooled_records", "records waiting in the on-disk spool")
#: observed where a batch is produced (collector/publish.py): the collector's share of an alert's delay, beside
#: the streams stages' jitterscope_streams_message_age_seconds (producer to stage)
BATCH_AGE = Histogram("jitterscope_collector_batch_age_seconds",
                      "a batch's oldest record when the batch is produced: its event time to the produce call",
                      ["topic"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))


class _Exported:
    """Adds to a Counter what a running total grew by since the last call."""

    def __init__(self):
        self._last: dict = {}

    def __call__(self, counter, total: int, *labels: str) -> None:
        key = (counter, labels)
        delta = total - self._last.get(key, 0)
        if delta > 0:
            (counter.labels(*labels) if labels else counter).inc(delta)
        self._last[key] = total
