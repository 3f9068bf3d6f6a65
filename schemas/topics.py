# SPDX-License-Identifier: Apache-2.0
"""Kafka topic names, their record types and the one partition count.

All topics share one partition count and every message is keyed by host, so
one streams worker owns all of a host's records and joins stay local.
"""

from __future__ import annotations

from jitterscope.schemas import events

PARTITIONS = 4

RUNQ = "jitterscope.runq"
HISTOGRAMS = "jitterscope.histograms"
TOPOLOGY = "jitterscope.topology"
PROCESSES = "jitterscope.processes"
COLLECTOR_STATS = "jitterscope.collector_stats"
REQUESTS = "jitterscope.requests"
GPU_IOCTL = "jitterscope.gpu_ioctl"
MIGRATIONS = "jitterscope.migrations"
PAGES = "jitterscope.pages"
DEVICE_IO = "jitterscope.device_io"
IRQ = "jitterscope.irq"
CGROUP_THROTTLE = "jitterscope.cgroup_throttle"
STACKS = "jitterscope.stacks"
BLOCKED = "jitterscope.blocked"
ATTRIBUTION = "jitterscope.attribution"
ALERTS = "jitterscope.alerts"
DEADLETTER = "jitterscope.deadletter"

#: Raw topics the collector writes and streams reads, with their record type.
INPUT_TOPICS: dict[str, type[events.Record]] = {
    RUNQ: events.RunqEvent,
    HISTOGRAMS: events.LatencyHistogram,
    TOPOLOGY: events.Topology,
    PROCESSES: events.ProcessInfo,
    COLLECTOR_STATS: events.CollectorStats,
    REQUESTS: events.RequestSpan,
    GPU_IOCTL: events.GpuIoctl,
    MIGRATIONS: events.Migrations,
    PAGES: events.PagePlacement,
    DEVICE_IO: events.DeviceIo,
    IRQ: events.IrqTime,
    CGROUP_THROTTLE: events.CgroupThrottle,
    STACKS: events.StackTrace,
    BLOCKED: events.BlockedWait,
}

OUTPUT_TOPICS = (ALERTS, ATTRIBUTION, DEADLETTER)

ALL_TOPICS = (*INPUT_TOPICS, *OUTPUT_TOPICS)

TOPIC_OF: dict[type[events.Record], str] = {t: name for name, t in INPUT_TOPICS.items()}
