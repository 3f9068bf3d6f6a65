# SPDX-License-Identifier: Apache-2.0
"""Event-loss rule (signal: the collector's own stats, topic
jitterscope.collector_stats): a host lost evidence between two stats
records. ``event_loss`` is pure; ``LossWatch`` only remembers each host's
previous record."""

from __future__ import annotations

import time

from jitterscope.schemas.events import Alert, CollectorStats


def lost_events(stats: CollectorStats) -> int:
    """Events a collector run lost on its host so far (cumulative counters)."""
    return stats.ringbuf_drops + stats.map_full_drops + stats.spool_drops


def event_loss(previous: CollectorStats | None, stats: CollectorStats, threshold: int,
               now_ns: int) -> Alert | None:
    """The host lost at least ``threshold`` events since the collector's
    previous stats record: the evidence is incomplete, say where it went."""
    same_run = previous if previous is not None and previous.started_ns == stats.started_ns else None
    lost = lost_events(stats) - (lost_events(same_run) if same_run else 0)
    if lost < threshold:
        return None
    parts = {"ringbuf_drops": stats.ringbuf_drops - (same_run.ringbuf_drops if same_run else 0),
             "map_full_drops": stats.map_full_drops - (same_run.map_full_drops if same_run else 0),
             "spool_drops": stats.spool_drops - (same_run.spool_drops if same_run else 0)}
    since = f"since {(stats.ts_ns - same_run.ts_ns) / 1e9:.0f} s ago" if same_run else "since the collector started"
    summary = f"{stats.host} lost {lost} events {since} (" + ", ".join(
        f"{name} {n}" for name, n in parts.items() if n) + ")"
    if parts["spool_drops"]:
        remedy = "Kafka was unreachable longer than the spool holds: fix the broker link or raise spool_max_mb"
    else:
        remedy = ("the kernel produced events faster than the collector read them: raise runq_threshold_ms, "
                  "narrow the targets (--comm/--pid), or give the collector more CPU")
    return Alert(
        host=stats.host, boot_id=stats.boot_id, seq=stats.seq, ts_ns=stats.ts_ns, raised_ns=now_ns,
        kind="event_loss", severity="warning", pid=0, tid=0, comm="", cpu=0, wait_ns=0, suspect_pid=0,
        suspect_comm="", cpus_allowed=[], summary=summary, remedy=remedy,
        evidence={name: str(n) for name, n in parts.items()})


class LossWatch:
    """Keeps each host's previous stats record to judge the next one against."""

    def __init__(self, threshold: int):
        self.threshold = threshold
        self._last: dict[tuple[str, str], CollectorStats] = {}

    def judge(self, stats: CollectorStats) -> Alert | None:
        key = (stats.host, stats.boot_id)
        previous = self._last.get(key)
        if previous is not None and previous.ts_ns > stats.ts_ns:
            return None  # an old record redelivered: already judged
        self._last[key] = stats
        return event_loss(previous, stats, self.threshold, time.time_ns())
