# SPDX-License-Identifier: Apache-2.0
"""Recent CFS throttling per (host, cgroup), for the rules that must tell a
throttled thread from a starved one (streams/rules/runq.py) and for the
cfs_throttling rule. Fed by the handlers from the cgroup_throttle topic.

A CgroupThrottle record covers (ts_ns - interval_ns, ts_ns]: its counters
moved then. The throttled time it reports may have begun earlier
(``throttled_span``). The collector
sends one per interval for every quota cgroup that ran (collector/probes/
throttle.py), so the newest record of a cgroup also says up to when its
throttling is known: a run-queue wait that ended later is judged once the
record covering it has come (``covered_until``).
"""

from __future__ import annotations

from collections import defaultdict, deque

from jitterscope.schemas.events import CgroupThrottle

HORIZON_NS = 120_000_000_000  # longer than any wait a rule judges, and the delay records can arrive with


def contains(parent: str, cgroup: str) -> bool:
    """``cgroup`` is ``parent`` or below it (a pod's quota limits its containers)."""
    parent = parent.rstrip("/")
    return cgroup == parent or cgroup.startswith(parent + "/")


def throttled_span(record: CgroupThrottle) -> tuple[int, int]:
    """When the throttled time a record reports can have been spent: its
    interval, and one quota period before it when it throttled. cpu.stat
    counts a throttled stretch (nr_throttled and throttled_time) when it
    ends, at the period timer that refills the quota (measured on 6.18: both
    move at the moment the thread runs again), so a stretch that ends in
    this interval may have begun in the previous one, whose record then
    shows none of it. (A stretch over several periods moves nr_throttled at
    each period's timer, so one period back is enough.)"""
    begin = record.ts_ns - record.interval_ns
    return (begin - record.period_us * 1000 if record.nr_throttled else begin), record.ts_ns


class ThrottleIndex:
    def __init__(self, horizon_ns: int = HORIZON_NS):
        self.horizon_ns = horizon_ns
        self._records: dict[str, dict[str, deque[CgroupThrottle]]] = defaultdict(dict)

    def add(self, record: CgroupThrottle) -> None:
        kept = self._records[record.host].setdefault(record.cgroup, deque())
        kept.append(record)
        while kept and kept[0].ts_ns < record.ts_ns - self.horizon_ns:
            kept.popleft()

    def limits(self, host: str, cgroup: str) -> list[str]:
        """The quota cgroups known on ``host`` that limit ``cgroup`` (itself or an ancestor)."""
        return [c for c in self._records.get(host, {}) if cgroup and contains(c, cgroup)]

    def limited(self, host: str, victim) -> bool:
        """Whether a quota cgroup is known above ``victim``'s (a process record, or None)."""
        cgroup = getattr(victim, "cgroup", "")
        return bool(cgroup and self.limits(host, cgroup))

    def covered_until(self, host: str, cgroup: str) -> int:
        """Epoch ns up to which the throttling of every quota cgroup above
        ``cgroup`` is known (0: none known)."""
        ends = [self._records[host][c][-1].ts_ns for c in self.limits(host, cgroup)]
        return min(ends) if ends else 0

    def throttled(self, host: str, cgroup: str, start_ns: int, end_ns: int) -> list[CgroupThrottle]:
        """Records of quota cgroups above ``cgroup`` that throttled during
        [start_ns, end_ns] (``throttled_span``)."""
        out: list[CgroupThrottle] = []
        for c in self.limits(host, cgroup):
            out.extend(r for r in self._records[host][c]
                       if r.nr_throttled and throttled_span(r)[0] < end_ns and r.ts_ns > start_ns)
        return out
