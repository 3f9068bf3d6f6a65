"""Alert rules: pure functions from evidence (and what is known about the
host) to an Alert, or None. No I/O, so each rule is unit-tested directly."""

from __future__ import annotations

import time
from dataclasses import dataclass

from jitterscope.schemas.events import Alert, CollectorStats, RequestAttribution, RunqEvent
from jitterscope.schemas.topology import cpu_list


@dataclass(frozen=True)
class ProcessView:
    comm: str
    cpus_allowed: list[int]


def runq_starvation(
    event: RunqEvent,
    alert_ns: int,
    victim: ProcessView | None,
    host_cpus: list[int] | None,
    now_ns: int,
) -> Alert | None:
    """A thread waited at least ``alert_ns`` for a CPU: name who held it and
    how to separate the two."""
    if event.wait_ns < alert_ns:
        return None
    wait_ms = event.wait_ns / 1e6
    victim_cpus = victim.cpus_allowed if victim else []
    suspect_name = f"{event.suspect_comm} (pid {event.suspect_pid})" if event.suspect_pid else "the idle/kernel task"
    summary = (
        f"{event.comm} (pid {event.pid}, tid {event.tid}) waited {wait_ms:.1f} ms for CPU {event.cpu}; "
        f"{suspect_name} held it"
    )
    others = [c for c in (host_cpus or []) if c not in victim_cpus] if victim_cpus else []
    if event.suspect_pid and event.suspect_pid != event.pid and others:
        remedy = (
            f"move {event.suspect_comm} off the inference CPUs: taskset -apc {cpu_list(others)} "
            f"{event.suspect_pid}; or reserve CPUs {cpu_list(victim_cpus)} for pid {event.pid} "
            "(cpuset / isolcpus)"
        )
    elif not event.suspect_pid:
        remedy = (
            f"CPU {event.cpu} was busy in the kernel (interrupts, softirqs, kernel threads): check "
            f"/proc/interrupts and move IRQs off CPUs {cpu_list(victim_cpus) or event.cpu} (irqbalance "
            "or /proc/irq/*/smp_affinity)"
        )
    elif event.suspect_pid != event.pid:
        remedy = (
            f"{event.suspect_comm} (pid {event.suspect_pid}) competes for CPU {event.cpu}: lower its priority "
            f"(renice 19 -p {event.suspect_pid}, or chrt --idle), or add CPU headroom for pid {event.pid}"
        )
    else:
        remedy = (
            f"pid {event.pid}'s own threads compete for CPU {event.cpu}: allow it more CPUs "
            f"(now {cpu_list(victim_cpus) or 'unknown'}) or run fewer busy threads"
        )
    severity = "critical" if event.wait_ns >= 10 * alert_ns else "warning"
    return Alert(
        host=event.host, boot_id=event.boot_id, seq=event.seq, ts_ns=event.ts_ns, raised_ns=now_ns,
        kind="runq_starvation", severity=severity, pid=event.pid, tid=event.tid, comm=event.comm,
        cpu=event.cpu, wait_ns=event.wait_ns, suspect_pid=event.suspect_pid,
        suspect_comm=event.suspect_comm, cpus_allowed=victim_cpus, summary=summary, remedy=remedy,
    )


def request_slo(attribution: RequestAttribution, comm: str, cpus_allowed: list[int],
                host_cpus: list[int] | None, now_ns: int) -> Alert | None:
    """A request broke its latency objective: say how long, against what
    normal, what the kernel evidence explains, and who to move."""
    a = attribution
    if not a.slo_breached:
        return None
    ms = lambda ns: f"{ns / 1e6:.0f} ms"  # noqa: E731
    top = a.suspects[0] if a.suspects else None
    summary = (f"request {a.request_id} ({a.name}) took {ms(a.duration_ns)}, SLO {ms(a.slo_ns)}, "
               f"normal {ms(a.baseline_ns)}; ")
    if a.cause == "runq_starvation":
        summary += f"its threads waited {ms(a.runq_wait_ns)} for a CPU ({a.explained:.0%} of the excess)"
        if top:
            summary += f"; top suspect {top.comm} (pid {top.pid}) {ms(top.wait_ns)}"
    else:
        summary += f"cause {a.cause}: run-queue waits explain {a.explained:.0%} of the excess"
    if a.cause == "runq_starvation" and top and top.pid and top.pid != a.pid:
        others = [c for c in (host_cpus or []) if c not in cpus_allowed] if cpus_allowed else []
        remedy = (f"move {top.comm} (pid {top.pid}) off the CPUs of pid {a.pid}: "
                  + (f"taskset -apc {cpu_list(others)} {top.pid}" if others
                     else f"renice 19 -p {top.pid}, or give pid {a.pid} dedicated CPUs"))
    elif a.cause == "runq_starvation":
        remedy = f"pid {a.pid} starves itself: allow it more CPUs or run fewer busy threads"
    else:
        remedy = "no kernel evidence explains it yet: check the model/batch size and GPU-side timings"
    return Alert(
        host=a.host, boot_id=a.boot_id, seq=a.seq, ts_ns=a.end_ns, raised_ns=now_ns, kind="request_slo",
        severity="critical" if a.duration_ns >= 2 * a.slo_ns else "warning", pid=a.pid, tid=0, comm=comm,
        cpu=0, wait_ns=a.runq_wait_ns, suspect_pid=top.pid if top else 0, suspect_comm=top.comm if top else "",
        cpus_allowed=cpus_allowed, summary=summary, remedy=remedy, request_id=a.request_id,
    )


def lost_events(stats: CollectorStats) -> int:
    """Events a collector run lost on its host so far (cumulative counters)."""
    return stats.ringbuf_drops + stats.map_full_drops + stats.spool_drops


def event_loss(previous: CollectorStats | None, stats: CollectorStats, threshold: int,
               now_ns: int) -> Alert | None:
    """The host lost at least ``threshold`` events since the collector's
    previous stats record: the evidence is incomplete, say where it went."""
    same_run = previous is not None and previous.started_ns == stats.started_ns
    before = lost_events(previous) if same_run else 0
    lost = lost_events(stats) - before
    if lost < threshold:
        return None
    parts = {"ringbuf_drops": stats.ringbuf_drops - (previous.ringbuf_drops if same_run else 0),
             "map_full_drops": stats.map_full_drops - (previous.map_full_drops if same_run else 0),
             "spool_drops": stats.spool_drops - (previous.spool_drops if same_run else 0)}
    since = f"since {(stats.ts_ns - previous.ts_ns) / 1e9:.0f} s ago" if same_run else "since the collector started"
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
