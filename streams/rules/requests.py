"""Request-latency rule (signal: request spans, topic jitterscope.requests,
judged once a request is attributed): a request broke its latency
objective. Pure: no I/O."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, RequestAttribution
from jitterscope.schemas.topology import cpu_list


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
