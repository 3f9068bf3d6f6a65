# SPDX-License-Identifier: Apache-2.0
"""Run-queue rule (signal: the run-queue probe, topic jitterscope.runq): a
thread waited too long for a CPU; name who held it and how to separate the
two -- unless its cgroup was throttled by its CPU quota during the wait:
then the task that ran next (often idle) did not take the CPU from it, and
the alert is cfs_throttling (streams/rules/throttle.py). Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from jitterscope.schemas.events import OWN_SUSPECT_PREFIX, Alert, CgroupThrottle, RunqEvent
from jitterscope.schemas.topology import cpu_list
from jitterscope.streams.rules import throttle


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
    throttles: Sequence[CgroupThrottle] = (),
) -> Alert | None:
    """A thread waited at least ``alert_ns`` for a CPU: name who held it and
    how to separate the two. ``throttles``: records of the quota cgroups
    above the thread that throttled during the wait (the throttle index)."""
    if event.wait_ns < alert_ns:
        return None
    if throttles and (throttled := throttle.throttled_wait(event, list(throttles), victim, now_ns)):
        return throttled
    wait_ms = event.wait_ns / 1e6
    victim_cpus = victim.cpus_allowed if victim else []
    own = event.suspect_own  # the collector knew it by pid (a name proves nothing: anyone can take it)
    suspect_name = (f"jitterscope itself ({event.suspect_comm.removeprefix(OWN_SUSPECT_PREFIX)}, "
                    f"pid {event.suspect_pid})" if own else
                    f"{event.suspect_comm} (pid {event.suspect_pid})" if event.suspect_pid else "the idle/kernel task")
    summary = (
        f"{event.comm} (pid {event.pid}, tid {event.tid}) waited {wait_ms:.1f} ms for CPU {event.cpu}; "
        f"{suspect_name} held it"
    )
    others = [c for c in (host_cpus or []) if c not in victim_cpus] if victim_cpus else []
    remedy = _remedy(event, victim_cpus, others, own)
    severity = "critical" if event.wait_ns >= 10 * alert_ns else "warning"
    return Alert(
        host=event.host, boot_id=event.boot_id, seq=event.seq, ts_ns=event.ts_ns, raised_ns=now_ns,
        kind="runq_starvation", severity=severity, pid=event.pid, tid=event.tid, comm=event.comm,
        cpu=event.cpu, wait_ns=event.wait_ns, suspect_pid=event.suspect_pid,
        suspect_comm=event.suspect_comm, cpus_allowed=victim_cpus, summary=summary, remedy=remedy,
        victim_stack=event.victim_stack, suspect_stack=event.suspect_stack,
    )


def _remedy(event: RunqEvent, victim_cpus: list[int], others: list[int], own: bool) -> str:
    """How to separate the waiting thread from what held its CPU (``others``:
    the host's CPUs the victim may not use)."""
    if own:
        remedy = (
            f"the cost of watching: keep jitterscope's {event.suspect_comm.removeprefix(OWN_SUSPECT_PREFIX)} off "
            f"CPUs {cpu_list(victim_cpus) or event.cpu} (CPUAffinity= of its unit, a cpuset, or taskset -apc "
            f"{cpu_list(others) or '<other CPUs>'} {event.suspect_pid}), or make it cheaper: a higher "
            "runq_threshold_ms, fewer hardware_probes, runq_stacks = false (`jitterscope doctor` shows its cost)"
        )
    elif event.suspect_pid and event.suspect_pid != event.pid and others:
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
    return remedy
