# SPDX-License-Identifier: Apache-2.0
"""CFS throttling rule (signal: the cfs sampler, topic
jitterscope.cgroup_throttle): a cgroup holding a serving process hit its CPU
quota. The cure is the limit (or exclusive CPUs), not the neighbours:
`taskset` or `renice` cannot give a throttled cgroup more CPU time. Also
builds the alert the run-queue rule raises instead of blaming a neighbour
when the waiting thread's cgroup was throttled during the wait. Pure: no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

import msgspec

from jitterscope.schemas.events import Alert, CgroupThrottle, ProcessInfo, RunqEvent
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.throttle_index import throttled_span

if TYPE_CHECKING:
    from jitterscope.streams.rules.runq import ProcessView  # it imports this module

MS = 1_000_000


def throttled_during(records: list[CgroupThrottle], start_ns: int, end_ns: int, whole: bool = False) -> int:
    """Throttled ns within [start_ns, end_ns], each record's throttled time
    spread evenly over its interval (a record is all the sampler knows).
    ``whole``: the CPU was idle while the thread waited (the task that ran
    next was the idle task), so a runnable thread can only have been held
    back by its quota: every overlapping throttled interval counts in full,
    from when its throttled time can have begun (``throttled_span``;
    streams/culprits.py charges requests the same way)."""
    total = 0
    for r in records:
        begin, end = throttled_span(r) if whole else (r.ts_ns - r.interval_ns, r.ts_ns)
        overlap = min(end, end_ns) - max(begin, start_ns)
        if overlap > 0 and r.interval_ns:
            total += overlap if whole else min(overlap, r.throttled_ns * overlap // r.interval_ns)
    return min(total, end_ns - start_ns)


def _limit(r: CgroupThrottle) -> str:
    cpus = r.quota_us / r.period_us if r.period_us else 0
    return f"quota {r.quota_us / 1000:g} ms per {r.period_us / 1000:g} ms period = {cpus:.2g} CPUs"


def _pod(process: object) -> TypeGuard[ProcessInfo]:
    """The process record names a pod (the run-queue rule may pass a bare ProcessView)."""
    return bool(getattr(process, "pod", ""))


def _where(r: CgroupThrottle, process: ProcessInfo | ProcessView | None) -> str:
    if _pod(process):
        container = f" container {process.container}" if process.container else ""
        return f"pod {process.namespace}/{process.pod}{container}"
    return f"cgroup {r.cgroup}"


def remedy(r: CgroupThrottle, process: ProcessInfo | ProcessView | None) -> str:
    cpus = r.quota_us / r.period_us if r.period_us else 0
    if _pod(process):
        return (f"raise the CPU limit of {_where(r, process)} (now {cpus:.2g} CPUs: kubectl set resources "
                f"-n {process.namespace} <deployment> --limits=cpu=<more>), or remove it; or run it as a "
                "Guaranteed pod with integer CPUs under the kubelet's static CPU manager policy "
                "(--cpu-manager-policy=static): exclusive CPUs are not throttled by neighbours' use")
    return (f"raise the CPU limit of cgroup {r.cgroup} (now {cpus:.2g} CPUs; cgroup v1: cpu.cfs_quota_us, "
            "v2: cpu.max; -1 / max removes it), or give it whole dedicated CPUs (cpuset) instead of a quota; "
            "in Kubernetes: a higher limit, or integer CPUs with the static CPU manager policy")


def _identity(alert: Alert, process: ProcessInfo | ProcessView | None) -> Alert:
    if not _pod(process):
        return alert
    return msgspec.structs.replace(alert, pod=process.pod, namespace=process.namespace, container=process.container)


def cfs_throttling(r: CgroupThrottle, holder: ProcessInfo | None, t: Thresholds, now_ns: int) -> Alert | None:
    """``holder``: a watched process in the cgroup (None: no serving process
    there, nothing to say)."""
    if holder is None or r.throttled_ns < t.cfs_throttle_ns:
        return None
    where = _where(r, holder)
    summary = (f"{where} holding {holder.comm} (pid {holder.pid}) was throttled {r.throttled_ns / MS:.0f} ms "
               f"in {r.interval_ns / MS:.0f} ms ({r.nr_throttled} of {r.nr_periods} periods; {_limit(r)})")
    severity = "critical" if r.throttled_ns >= 10 * t.cfs_throttle_ns else "warning"
    alert = Alert(
        host=r.host, boot_id=r.boot_id, seq=r.seq, ts_ns=r.ts_ns, raised_ns=now_ns, kind="cfs_throttling",
        severity=severity, pid=holder.pid, tid=0, comm=holder.comm, cpu=0, wait_ns=r.throttled_ns,
        suspect_pid=0, suspect_comm="", cpus_allowed=list(holder.cpus_allowed), summary=summary,
        remedy=remedy(r, holder), evidence=_evidence(r))
    return _identity(alert, holder)


def _evidence(r: CgroupThrottle) -> dict[str, str]:
    return {"cgroup": r.cgroup, "quota_us": str(r.quota_us), "period_us": str(r.period_us),
            "nr_throttled": str(r.nr_throttled), "nr_periods": str(r.nr_periods),
            "throttled_ms": f"{r.throttled_ns / MS:.1f}"}


def throttled_wait(event: RunqEvent, records: list[CgroupThrottle], victim: ProcessInfo | ProcessView | None,
                   now_ns: int) -> Alert | None:
    """The run-queue wait ``event`` was (mostly) its cgroup's throttling:
    at least half of it overlaps throttled time of a quota cgroup above the
    thread (``records``, from the throttle index). None otherwise: then the
    CPU's other tasks are to blame, as the run-queue rule says."""
    start = event.ts_ns - event.wait_ns
    throttled = throttled_during(records, start, event.ts_ns, whole=event.suspect_pid == 0)
    if not records or 2 * throttled < event.wait_ns:
        return None
    r = max(records, key=lambda x: x.throttled_ns)
    summary = (f"{event.comm} (pid {event.pid}, tid {event.tid}) waited {event.wait_ns / MS:.1f} ms for CPU "
               f"{event.cpu} while {_where(r, victim)} was throttled by its CPU quota ({_limit(r)}; "
               f"~{throttled / MS:.0f} ms throttled during the wait), not held by "
               f"{event.suspect_comm or 'another task'}")
    alert = Alert(
        host=event.host, boot_id=event.boot_id, seq=event.seq, ts_ns=event.ts_ns, raised_ns=now_ns,
        kind="cfs_throttling", severity="warning", pid=event.pid, tid=event.tid, comm=event.comm,
        cpu=event.cpu, wait_ns=event.wait_ns, suspect_pid=0, suspect_comm="",
        cpus_allowed=list(victim.cpus_allowed) if victim else [], summary=summary, remedy=remedy(r, victim),
        evidence={**_evidence(r), "throttled_during_wait_ms": f"{throttled / MS:.1f}"})
    return _identity(alert, victim)
