# SPDX-License-Identifier: Apache-2.0
"""The signal itself on /metrics, for a shop that has Prometheus and no
ClickHouse: run-queue wait and GPU driver call latency as Prometheus
histograms, per process name, from the log2 histograms the collectors send
(every wait, not only those over the kernel threshold).

The buckets are the collector's own: slot ``s`` holds latencies in
[2^s, 2^(s+1)) microseconds, so it is counted under ``le = 2^(s+1)`` us
(in seconds) and the exposition is exact, not re-bucketed. ``_sum`` is
estimated from bucket midpoints (1.5 x 2^s us, as the latency_minute rollup
does): the kernel keeps counts, not sums.

Label cardinality is capped: the first ``max_comms`` process names seen keep
their own series and every later one is counted under ``comm="other"``. The
set is sticky (a name never moves between its own series and "other"), so
every series stays a monotonic counter that rate() can trust.
"""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.core import HistogramMetricFamily

from jitterscope.schemas import events

#: log2 slots with their own bucket: le = 2^1 us .. 2^27 us (~134 s); slower is +Inf only
SLOTS = 27
BOUNDS_S = [2.0 ** (s + 1) / 1e6 for s in range(SLOTS)]
OTHER = "other"
DEFAULT_MAX_COMMS = 20


class Log2Histograms:
    """Cumulative per-comm log2 histograms, exposed as one Prometheus histogram."""

    def __init__(self, name: str, documentation: str, max_comms: int = DEFAULT_MAX_COMMS):
        self.name, self.documentation, self.max_comms = name, documentation, max_comms
        self._counts: dict[str, list[int]] = {}  # comm -> count per slot, then the overflow slot
        self._sums: dict[str, float] = {}

    def label(self, comm: str) -> str:
        if comm in self._counts or len(self._counts) < self.max_comms:
            return comm
        return OTHER

    def add(self, comm: str, slots: list[int], counts: list[int]) -> None:
        key = self.label(comm)
        buckets = self._counts.setdefault(key, [0] * (SLOTS + 1))
        for slot, count in zip(slots, counts):
            buckets[min(slot, SLOTS)] += count
            self._sums[key] = self._sums.get(key, 0.0) + count * 1.5 * 2.0 ** slot / 1e6

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation, labels=["comm"])]

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=["comm"])
        for comm, counts in sorted(self._counts.items()):
            running, buckets = 0, []
            for bound, count in zip(BOUNDS_S, counts):
                running += count
                buckets.append((repr(bound), running))
            buckets.append(("+Inf", running + counts[SLOTS]))
            family.add_metric([comm], buckets, self._sums.get(comm, 0.0))
        yield family


RUNQ_WAIT = Log2Histograms(
    "jitterscope_runq_wait_seconds",
    "run-queue wait (woken until on a CPU) of watched processes, every wait, from the collectors' log2 "
    "histograms; _sum estimated from bucket midpoints; process names beyond the cap are comm=\"other\"")
GPU_IOCTL = Log2Histograms(
    "jitterscope_gpu_ioctl_latency_seconds",
    "GPU driver call (ioctl) latency of watched processes, every call, from the collectors' log2 histograms; "
    "_sum estimated from bucket midpoints; process names beyond the cap are comm=\"other\"")
BY_PROBE = {"runq": RUNQ_WAIT, "gpu_ioctl": GPU_IOCTL}
for _histogram in BY_PROBE.values():
    REGISTRY.register(_histogram)


def limit_comms(max_comms: int) -> None:
    """The label cap (settings.metrics_comms_max); set before records arrive."""
    for histogram in BY_PROBE.values():
        histogram.max_comms = max_comms


def observe(records: list[events.LatencyHistogram]) -> None:
    for r in records:
        histogram = BY_PROBE.get(r.probe)
        if histogram is not None:  # a probe this worker release does not chart yet
            histogram.add(r.comm, r.slots, r.counts)
