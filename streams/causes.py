# SPDX-License-Identifier: Apache-2.0
"""Which cause a request's excess is named: what its run-queue waits, stalls
and GPU driver calls add up to (``Charges``, filled by streams/attribution.py)
weighed against the excess (``weigh``). Pure logic, no I/O.

Each candidate is how much of the excess it explains; the largest is named
if it explains at least DOMINANT_SHARE, else the request is "unexplained".
Two refinements keep the group's own threads from being named for what is
routine or what another cause did:

- the carrying thread's waits behind the threads that held its GIL weigh
  for ``gil_contention``, not ``self_contention``: a thread that holds the
  GIL and a CPU delays it both ways, one culprit;
- where the request was not carried by one thread (its thread mostly
  slept, waiting on the group's others), ``self_contention`` counts only
  the group's waits behind its own threads beyond the usual amount (the
  median of such requests', ``Attributor`` learns it): vLLM's engine waits
  behind its front end on every request on 2 CPUs, and quiet requests a
  little over the median were named self_contention for that routine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jitterscope.schemas.events import GpuIoctl, IrqTime, Suspect
from jitterscope.streams.thread_budget import STALLS, ThreadBudget

# Excess under max(1 ms, a quarter of the baseline, the usual spread) is ordinary jitter: nothing to explain.
NO_EXCESS_NS = 1_000_000
NO_EXCESS_SHARE = 0.25
# The usual spread: how far the USUAL_QUANTILE of a group's recent requests' service times is over their
# median (Attributor learns it with the baseline). A noisy server's ordinary request is not a finding; but
# an excess of SLOWED_SHARE of the baseline always is (slowed 1.5x): a real vLLM's GIL-hogged requests left
# service times of 700 ms in the window (waits not seen), and a spread that wide named 3 of 20 of them none.
USUAL_QUANTILE = 0.9
SLOWED_SHARE = 0.5
DOMINANT_SHARE = 0.5  # a cause must explain at least half the excess to be named
MIN_SHARE = 0.05  # a cause listed beside it (RequestAttribution.causes): a twentieth of the excess or more
# Requests seen before their usual self-contention counts: a median of a few is enough to take
# routine out (waiting for the baseline's 20 left a real vLLM's first ordinary requests named for it)
USUAL_AFTER = 5


@dataclass
class Charges:
    """What a request's run-queue waits and GPU driver calls add up to, and
    whom and what its run-queue waits are charged to."""

    runq: tuple[int, int, int] = (0, 0, 0)  # its run-queue parts: (ns in all, the longest, how many)
    suspects: list[Suspect] = field(default_factory=list)  # the top TOP_SUSPECTS outside the group
    throttled: int = 0  # ns its cgroup's (or an ancestor's) throttling explains
    throttles: dict[str, int] = field(default_factory=dict)  # the same per cgroup
    irq: int = 0  # ns interrupts took from it
    sources: dict[tuple[int, str, str], int] = field(default_factory=dict)  # the same per (cpu, kind, source)
    irq_records: dict[tuple[int, str, str], IrqTime] = field(default_factory=dict)  # each source's latest record
    own_ns: int = 0  # held by the group's own threads
    own_threads: set[int] = field(default_factory=set)  # those threads
    behind_gil_holders: int = 0  # ns the carrying thread waited for a CPU behind the threads that held its GIL
    idle_ns: int = 0  # held by no one: the idle task had the CPU (waking an idle CPU)
    ioctl: tuple[int, int, int] = (0, 0, 0)  # its GPU driver calls: (ns in all, the longest, how many)
    longest_call: GpuIoctl | None = None  # the one the alert names
    contributed: set[int] = field(default_factory=set)  # the processes whose evidence was charged
    carried: bool = False  # one thread's waits are the request's delay (streams/thread_budget.py, carried_parts)


def union_share(charged: Charges, waited: int) -> float:
    """The weight of a request's run-queue parts: how long any of its threads
    waited (their union) over the sum of their waits. The group's threads
    waiting at the same moment delay the request once: a model's 8 worker
    threads queued for the same 10 ms are 10 ms, not 80, beside the 50 ms
    its front end waited for the GIL. One thread's waits never overlap."""
    return waited / charged.runq[0] if charged.runq[0] else 1.0


def self_contention_ns(charged: Charges, waited: int) -> int:
    """The group's waits behind its own threads, as weighed, less those behind its GIL's holders."""
    return int(union_share(charged, waited) * (charged.own_ns - min(charged.own_ns, charged.behind_gil_holders)))


def weigh(excess: int, baseline: int, waited: int, charged: Charges, budget: ThreadBudget,
          usual_own_ns: int = 0, spread_ns: int = 0,
          chained: dict[str, int] | None = None) -> tuple[str, float, list[tuple[str, float]]]:
    """What caused a request's excess; how much of it its causes explain
    together (at most 1: a GIL holder's run-queue waits inside the GIL wait
    count for both); and every cause with its share, largest first (causes
    stack: a thread waits for the GIL, then for a CPU). "none" when the
    excess is ordinary jitter (``spread_ns``: the usual spread; the caller
    passes 0 for a request over its SLO, which always gets its parts),
    "unexplained" when no cause explains at least DOMINANT_SHARE of it.
    ``usual_own_ns``: the self-contention such requests usually have (not a
    cause). ``chained``: stalls (cause -> ns) of the threads its thread slept
    on (streams/wait_chain.py)."""
    if excess < max(NO_EXCESS_NS, NO_EXCESS_SHARE * baseline, min(spread_ns, SLOWED_SHARE * baseline)):
        return "none", 0.0, []
    runq, throttled, irq, own_ns = charged.runq[0], charged.throttled, charged.irq, charged.own_ns
    share = union_share(charged, waited)
    steal = sum(ns for (_cpu, kind, _source), ns in charged.sources.items() if kind == "steal")  # the hypervisor's
    stalls = {STALLS[kind]: budget.blocked.get(kind, 0) for kind in STALLS}
    stalls["gil_contention"] += int(share * min(own_ns, charged.behind_gil_holders))  # one culprit
    for cause, ns in (chained or {}).items():
        stalls[cause] += ns
    candidates = sorted(((name, min(1.0, ns / excess)) for name, ns in (
        ("runq_starvation", share * (runq - throttled - irq - own_ns - charged.idle_ns)),
        ("cfs_throttling", share * throttled), ("irq", share * (irq - steal)), ("steal", share * steal),
        ("self_contention", self_contention_ns(charged, waited) - usual_own_ns),
        ("gpu_ioctl_stall", charged.ioctl[0]), *stalls.items()) if ns >= MIN_SHARE * excess),
        key=lambda c: -c[1])
    if not candidates:
        return "unexplained", 0.0, []
    name, top = candidates[0]
    return (name if top >= DOMINANT_SHARE else "unexplained"), min(1.0, sum(s for _, s in candidates)), candidates
