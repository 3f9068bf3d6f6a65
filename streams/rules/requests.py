# SPDX-License-Identifier: Apache-2.0
"""Request-latency rule (signal: request spans, topic jitterscope.requests,
judged once a request is attributed): a request broke its latency
objective. Pure: no I/O."""

from __future__ import annotations

from jitterscope.schemas.gpu_health import SLOWDOWNS, xid_info
from jitterscope.schemas.events import Alert, CgroupThrottle, IrqTime, RequestAttribution
from jitterscope.schemas.topology import cpu_list

# what to do about a softirq vector on a serving CPU, beside moving its source
SOFTIRQ_FIX = {
    "NET_RX": "spread receive processing off these CPUs: the NIC queue IRQs' smp_affinity_list and RPS "
              "(/sys/class/net/DEV/queues/rx-*/rps_cpus)",
    "NET_TX": "move the NIC's transmit queue IRQs (/proc/irq/N/smp_affinity_list) and XPS "
              "(/sys/class/net/DEV/queues/tx-*/xps_cpus) off these CPUs",
    "BLOCK": "move the storage device's completion IRQs (/proc/irq/N/smp_affinity_list, e.g. nvme queues) "
             "off these CPUs",
}


def _limit(t: CgroupThrottle) -> str:
    if t.quota_us < 0:
        return f"cgroup {t.cgroup} (a parent's limit applies)"
    return (f"cgroup {t.cgroup}: quota {t.quota_us / 1000:g} ms per {t.period_us / 1000:g} ms period "
            f"(= {t.quota_us / t.period_us:.2f} CPUs)")


def _throttle_remedy(a: RequestAttribution, t: CgroupThrottle | None) -> str:
    where = _limit(t) if t else "its cgroup's CPU limit"
    if a.pod:
        return (f"pod {a.namespace}/{a.pod} (container {a.container or '?'}) is held to its CPU limit, {where}: "
                f"raise resources.limits.cpu, or make the pod Guaranteed with integer CPU requests under the "
                f"kubelet's static CPU manager policy (--cpu-manager-policy=static) so it gets whole CPUs, unthrottled")
    return (f"pid {a.pid} is held to its CPU limit, {where}: raise cpu.cfs_quota_us (CPUQuota= of its systemd "
            f"unit, --cpus of its container) or remove it")


def _irq_remedy(a: RequestAttribution, irq: IrqTime | None, others: list[int]) -> str:
    if irq is None:
        return f"interrupts took the CPUs of pid {a.pid}: move them elsewhere"
    move_to = cpu_list(others) if others else "other CPUs"
    if irq.kind == "hardirq":
        number = irq.source.split(":", 1)[0]
        return (f"IRQ {irq.source} ran on CPU {irq.cpu}, which pid {a.pid} serves on: "
                f"echo {move_to} > /proc/irq/{number}/smp_affinity_list (and keep irqbalance from moving it back)")
    fix = SOFTIRQ_FIX.get(irq.source, "move the device interrupts that raise it off these CPUs, or isolate them")
    return f"softirq {irq.source} ran on CPU {irq.cpu}, which pid {a.pid} serves on: {fix} (to {move_to})"


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.0f} ms"


def _summary(a: RequestAttribution, irq: IrqTime | None) -> str:
    """How long the request took, against what normal, and what the kernel
    evidence of its cause explains."""
    top = a.suspects[0] if a.suspects else None
    share = a.causes[0].share if a.causes else a.explained  # the cause's own share
    summary = (f"request {a.request_id} ({a.name}) took {_ms(a.duration_ns)}, SLO {_ms(a.slo_ns)}, "
               f"normal {_ms(a.baseline_ns)}; ")
    if a.token_slo_breached:  # its model's token objectives (streams/token_slo.py): what its user waited for
        took = {"ttft": f"time to first token {_ms(a.ttft_ns)}", "itl": f"time between tokens {_ms(a.itl_ns)}"}
        summary = (f"request {a.request_id} ({a.name}, model {a.model or '?'}): "
                   + ", ".join(took[name] for name in a.token_slo_breached) + " over its objective; "
                   + summary.split(") ", 1)[1])
    processes = f" across pids {','.join(map(str, a.pids))}" if len(a.pids) > 1 else ""
    if a.cause == "runq_starvation":
        summary += (f"its threads{processes} waited {_ms(a.runq_wait_ns)} for a CPU "
                    f"({share:.0%} of the excess)")
        if top:
            summary += f"; top suspect {top.comm} (pid {top.pid}) {_ms(top.wait_ns)}"
    elif a.cause == "self_contention":
        summary += (f"its threads{processes} waited {_ms(a.self_wait_ns)} for CPUs held by {a.self_threads} "
                    f"thread(s) of its own serving group ({share:.0%} of the excess): more runnable "
                    f"threads than CPUs, no neighbour")
    elif a.cause == "cfs_throttling":
        summary += (f"its threads{processes} were CPU-throttled by their cgroup for {_ms(a.throttled_ns)} "
                    f"({share:.0%} of the excess)")
    elif a.cause == "irq":
        summary += f"interrupts held its CPUs for {_ms(a.irq_ns)} of its threads' waits ({share:.0%} of the excess)"
        if irq:
            summary += f"; top source {irq.kind} {irq.source} on CPU {irq.cpu}"
    elif a.cause == "steal":
        summary += f"the hypervisor took the vCPUs its threads waited for (steal time, {share:.0%} of the excess)"
    elif a.cause == "gpu_ioctl_stall":
        summary += f"GPU driver calls took {_ms(a.gpu_ioctl_ns)} ({share:.0%} of the excess)"
        if a.gpu_ioctl_call:
            summary += f"; longest {a.gpu_ioctl_call} {_ms(a.gpu_ioctl_max_ns)}"
    elif a.cause == "gil_contention":
        summary += (f"its thread {a.thread_tid} waited {_ms(a.gil_wait_ns)} for the Python interpreter lock "
                    f"({share:.0%} of the excess), held by {a.culprit or 'another thread'}")
    elif a.cause == "memory_stall":
        summary += (f"its thread {a.thread_tid} was blocked {_ms(a.memory_wait_ns)} on memory: page-cache "
                    f"faults read back from disk, or reclaim ({share:.0%} of the excess)")
    elif a.cause == "io_wait":
        summary += (f"its thread {a.thread_tid} was blocked {_ms(a.io_wait_ns)} in uninterruptible I/O "
                    f"({share:.0%} of the excess)" + (f", on {a.culprit}" if a.culprit else ""))
    elif a.cause == "gpu_xid":
        summary += (f"its GPU logged Xid {a.gpu_xid} during it ({xid_info(a.gpu_xid).meaning}); nothing on the "
                    f"CPU side explains the excess")
    elif a.cause == "gpu_throttle":
        summary += (f"its GPU was clocked down during it ({', '.join(a.gpu_throttle)}); nothing on the CPU side "
                    f"explains the excess")
    else:
        summary += f"cause {a.cause}: run-queue waits explain {share:.0%} of the excess"
    return summary + _beside(a)


def _beside(a: RequestAttribution) -> str:
    """The wait-for chain its thread slept on, the causes stacked beside the first, and its phases."""
    text = ""
    if a.chain:
        text += "; it slept on " + ", which slept on ".join(
            f"{hop.comm}[{hop.tid}] {_ms(hop.waited_ns)}" + ("" if hop.kind == "sleep" else
                                                            f" ({_KIND.get(hop.kind, hop.kind)} {_ms(hop.ns)}"
                                                            + (f", {hop.culprit}" if hop.culprit else "") + ")")
            for hop in a.chain)
    rest = [c for c in a.causes if c.cause != a.cause]
    if rest:
        text += "; also " + ", ".join(f"{c.cause} {c.share:.0%}" for c in rest)
    text += f"; {a.explained:.0%} of the excess explained" if rest else ""
    if a.phases:  # which cause took the queue, which the decode (streams/phases.py)
        text += "; by phase: " + ", ".join(
            f"{p.phase} {_ms(p.ns)}" + (f" ({_ms(p.cause_ns)} {p.cause}" + (f", {p.culprit}" if p.culprit else "")
                                        + ")" if p.cause else "") for p in a.phases)
    return text


#: what a chain's hop was doing, in words
_KIND = {"runq": "waiting for a CPU", "gil": "waiting for the GIL", "memory": "blocked on memory",
         "io": "in I/O", "cpu": "on its CPU"}


def _remedy(a: RequestAttribution, cpus_allowed: list[int], others: list[int], throttle: CgroupThrottle | None,
            irq: IrqTime | None) -> str:
    """What to change for the cause: the neighbour to move (to ``others``:
    the host's CPUs the process may not use), the limit to raise, the
    interrupt to move, the threads or the work to take off the process."""
    top = a.suspects[0] if a.suspects else None
    if a.cause == "cfs_throttling":
        return _throttle_remedy(a, throttle)
    if a.cause == "irq":
        return _irq_remedy(a, irq, others)
    if a.cause == "steal":
        return ("the hypervisor ran other work on this VM's vCPUs (steal time); no process here is to blame: ask "
                "for dedicated vCPUs (a CPU-pinned or larger instance), or move the VM to a less loaded host")
    if a.cause == "runq_starvation" and top and top.pid and top.pid != a.pid:
        return (f"move {top.comm} (pid {top.pid}) off the CPUs of pid {a.pid}: "
                + (f"taskset -apc {cpu_list(others)} {top.pid}" if others
                   else f"renice 19 -p {top.pid}, or give pid {a.pid} dedicated CPUs"))
    if a.cause in ("runq_starvation", "self_contention"):
        cpus = f"its {len(cpus_allowed)} CPU(s) ({cpu_list(cpus_allowed)})" if cpus_allowed else "its CPUs"
        return (f"{a.self_threads or 'several'} busy thread(s) of pid {a.pid}'s serving group compete for {cpus}: "
                f"run fewer (OMP_NUM_THREADS, torch.set_num_threads, fewer tokenizer/detokenizer workers) "
                f"or give it more CPUs")
    if a.cause == "gpu_ioctl_stall":
        return (f"the GPU driver was slow{' in ' + a.gpu_ioctl_call if a.gpu_ioctl_call else ''}: "
                f"see the gpu_ioctl_stall / pcie_contention alerts of these pids")
    if a.cause == "gil_contention":
        return (f"{a.culprit or 'another thread'} holds pid {a.pid}'s GIL while it serves: move that work out of "
                f"the serving process (a worker process, or a C extension that releases the GIL), or lower "
                f"sys.setswitchinterval so the lock changes hands sooner")
    if a.cause == "memory_stall":
        return (f"pid {a.pid}'s pages (weights, page cache) were evicted and read back: protect them "
                f"(memory.low/memory.min of its cgroup, mlock or pre-fault the weights), or raise the memory "
                f"limit it shares, or move the process that fills it (see the page-cache producers in the pages "
                f"table)")
    if a.cause == "io_wait":
        device = f"{a.culprit}'s" if a.culprit else "the device's"
        return (f"pid {a.pid} read or wrote storage on the request's path: keep it off the path (preload, "
                f"asynchronous I/O), or find {device} other users (the device_io table)")
    if a.cause == "gpu_xid":
        return f"{a.culprit or f'Xid {a.gpu_xid}'}: {xid_info(a.gpu_xid).remedy}"
    if a.cause == "gpu_throttle":
        return "; ".join(SLOWDOWNS[r] for r in a.gpu_throttle if r in SLOWDOWNS)
    return "no kernel evidence explains it yet: check the model/batch size and GPU-side timings"


def request_slo(attribution: RequestAttribution, comm: str, cpus_allowed: list[int],
                host_cpus: list[int] | None, now_ns: int, throttle: CgroupThrottle | None = None,
                irq: IrqTime | None = None) -> Alert | None:
    """A request broke its latency objective: say how long, against what
    normal, what the kernel evidence explains, and what to change: the
    neighbour to move, the CPU limit to raise (``throttle``: the latest
    throttled interval of the cgroup charged), or the interrupt to move
    (``irq``: the source charged most)."""
    a = attribution
    if not (a.slo_breached or a.token_slo_breached):
        return None
    top = a.suspects[0] if a.suspects else None
    others = [c for c in (host_cpus or []) if c not in cpus_allowed] if cpus_allowed else []
    pids = ",".join(map(str, a.pids))
    return Alert(
        host=a.host, boot_id=a.boot_id, seq=a.seq, ts_ns=a.end_ns, raised_ns=now_ns, kind="request_slo",
        severity="critical" if a.slo_breached and a.duration_ns >= 2 * a.slo_ns else "warning", pid=a.pid, tid=0,
        comm=comm,
        cpu=0, wait_ns=a.runq_wait_ns, suspect_pid=top.pid if top else 0, suspect_comm=top.comm if top else "",
        cpus_allowed=cpus_allowed, summary=_summary(a, irq), remedy=_remedy(a, cpus_allowed, others, throttle, irq),
        request_id=a.request_id, pod=a.pod, namespace=a.namespace, container=a.container, suspect_stack=a.culprit_stack,
        evidence={k: str(v) for k, v in (("pids", pids), ("throttled_ms", a.throttled_ns / 1e6),
                                         ("irq_ms", a.irq_ns / 1e6), ("self_wait_ms", a.self_wait_ns / 1e6),
                                         ("gil_wait_ms", a.gil_wait_ns / 1e6),
                                         ("memory_wait_ms", a.memory_wait_ns / 1e6),
                                         ("io_wait_ms", a.io_wait_ns / 1e6), ("culprit", a.culprit),
                                         ("gpu_xid", a.gpu_xid), ("gpu_throttle", ",".join(a.gpu_throttle)),
                                         ("cause", a.cause))
                  if v},
    )
