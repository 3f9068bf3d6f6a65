# SPDX-License-Identifier: Apache-2.0
"""Kafka topic names, their record types and the one partition count
(the input topics come from the signal catalogue, schemas/signals.py).

All topics share one partition count and every message is keyed by host, so
one streams worker owns all of a host's records and joins stay local.
"""

from __future__ import annotations

from jitterscope.schemas import events, signals

PARTITIONS = 4

_topic = {name: signal.topic for name, signal in signals.BY_NAME.items()}
RUNQ = _topic["runq"]
HISTOGRAMS = _topic["histograms"]
TOPOLOGY = _topic["topology"]
PROCESSES = _topic["processes"]
COLLECTOR_STATS = _topic["collector_stats"]
REQUESTS = _topic["requests"]
GPU_IOCTL = _topic["gpu_ioctl"]
MIGRATIONS = _topic["migrate"]
PAGES = _topic["pages"]
DEVICE_IO = _topic["device_io"]
IRQ = _topic["irq"]
CGROUP_THROTTLE = _topic["throttle"]
STACKS = _topic["stacks"]
BLOCKED = _topic["blocked"]
GPU_XID = _topic["xid"]
GPU_TELEMETRY = _topic["nvml"]
ATTRIBUTION = "jitterscope.attribution"
ALERTS = "jitterscope.alerts"
DEADLETTER = "jitterscope.deadletter"
#: every alert a judge stage raises, folded ones included (streams/stages.py), for the store stage to store:
#: the alerts topic carries only what people see
ALERT_ROWS = "jitterscope.alert_rows"

#: Raw topics the collector writes and streams reads, with their record type (schemas/signals.py).
INPUT_TOPICS: dict[str, type[events.Record]] = {s.topic: s.record for s in signals.SIGNALS}

OUTPUT_TOPICS = (ALERTS, ATTRIBUTION, DEADLETTER, ALERT_ROWS)

ALL_TOPICS = (*INPUT_TOPICS, *OUTPUT_TOPICS)

TOPIC_OF: dict[type[events.Record], str] = {t: name for name, t in INPUT_TOPICS.items()}
