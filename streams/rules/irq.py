# SPDX-License-Identifier: Apache-2.0
"""Interrupt rule (signal: the irq probe, topic jitterscope.irq): one hard
IRQ or softirq source, or the hypervisor (steal), took a large share of a CPU over an interval. Its
time is stolen from whatever runs there, and no scheduler setting helps: the
interrupt has to move. Pure: no I/O."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, IrqTime
from jitterscope.schemas.topology import cpu_list
from jitterscope.streams.rules.base import Thresholds

HOUSEKEEPING = {"TIMER", "HRTIMER", "SCHED", "RCU"}  # the kernel's own per-CPU work


def remedy(r: IrqTime, targets: list[int]) -> str:
    """``targets``: CPUs to move the interrupt to (away from the serving processes)."""
    to = cpu_list(targets) if targets else "<cpus away from the inference processes>"
    if r.kind == "steal":
        return (f"the hypervisor ran other work on vCPU {r.cpu}: no process here is to blame; ask for dedicated "
                f"vCPUs (a CPU-pinned or larger instance) or move the VM to a less loaded host")
    if r.kind == "hardirq":
        irq = r.source.split(":", 1)[0]
        return (f"move IRQ {irq} ({r.source.split(':', 1)[-1] or 'unnamed'}) off CPU {r.cpu}: "
                f"echo {to} > /proc/irq/{irq}/smp_affinity_list (and keep irqbalance from moving it back: "
                f"IRQBALANCE_BANNED_CPULIST={cpu_list([r.cpu])})")
    if r.source in ("NET_RX", "NET_TX"):
        return (f"network softirqs run on the CPU that took the NIC queue's interrupt: move that queue's IRQ "
                f"(grep the NIC in /proc/interrupts; echo {to} > /proc/irq/<N>/smp_affinity_list), spread "
                f"receive work with RSS (ethtool -L <nic> combined <n>) or RPS "
                f"(/sys/class/net/<nic>/queues/rx-*/rps_cpus) over CPUs {to}")
    if r.source in ("BLOCK", "IRQ_POLL"):
        return (f"block completions run where the disk queue's IRQ lands: move the NVMe/disk queue IRQ "
                f"(/proc/interrupts) with echo {to} > /proc/irq/<N>/smp_affinity_list")
    if r.source in HOUSEKEEPING:
        return (f"kernel housekeeping ({r.source}) on CPU {r.cpu}: keep it off the serving CPUs with "
                f"nohz_full=/rcu_nocbs= (boot) or isolcpus, and look for timer-heavy tasks there")
    return f"find what raises {r.source} softirqs on CPU {r.cpu} and move it to CPUs {to}"


def irq_time(r: IrqTime, serving_cpus: set[int], host_cpus: list[int] | None, t: Thresholds,
             now_ns: int) -> Alert | None:
    """``serving_cpus``: CPUs the host's serving processes may run on (the
    remedy moves the interrupt away from them, when the host has others)."""
    share = r.time_ns / r.interval_ns if r.interval_ns else 0
    if share < t.irq_share:
        return None
    others = [c for c in host_cpus or [] if c != r.cpu]
    targets = [c for c in others if c not in serving_cpus] or others
    what = {"hardirq": f"IRQ {r.source}", "steal": "the hypervisor (steal time)"}.get(r.kind, f"softirq {r.source}")
    summary = (f"{what} took {share:.0%} of CPU {r.cpu} ({r.time_ns / 1e6:.1f} ms in {r.interval_ns / 1e6:.0f} ms, "
               f"{r.count} runs)" + (" where serving processes run" if r.cpu in serving_cpus else ""))
    return Alert(
        host=r.host, boot_id=r.boot_id, seq=r.seq, ts_ns=r.ts_ns, raised_ns=now_ns, kind="irq",
        severity="critical" if share >= 0.5 else "warning", pid=0, tid=0, comm="", cpu=r.cpu,
        wait_ns=r.time_ns, suspect_pid=0, suspect_comm="", cpus_allowed=[], summary=summary,
        remedy=remedy(r, targets),
        evidence={"kind": r.kind, "source": r.source, "share": f"{share:.3f}", "count": str(r.count)})
