# SPDX-License-Identifier: Apache-2.0
"""The one interface every signal implements, and what the agent hands it.

A signal is one module in collector/probes/ (runq, gpu_ioctl, migrate,
pages, blockio, netdev); the registry (collector/probes/registry.py) maps
its name -- the value of the ``hardware_probes`` setting, "runq" always on --
to its class. The agent (collector/agent.py) loops over the enabled ones:

    probe.open(context)                      load, attach, take a baseline
    probe.set_targets(pids, thresholds)      the watched processes changed
    probe.rescan()                           every target_rescan_s
    probe.poll(timeout_ms)                   often: event records go out
                                             through context.publish
    probe.periodic(interval_ns, now_ns)      every histogram interval: the
                                             records to publish (histograms,
                                             counters), stamped with now_ns
    probe.forget(pids)                       processes that have exited
    probe.drops() / probe.map_full_drops()   kernel-side losses, cumulative
    probe.close()

A signal that raises in any of these after opening is closed and dropped
(``call_each``), and the others keep running: one probe's fault (a map the
kernel refuses, a vanished device) must not end the collector's other
signals or lose the records already queued.

``publishes`` names the record types a signal produces. Stamping (host, boot
id, sequence, epoch time) is done once, by the agent's Stamp behind
``ProbeContext.record``; per-process log2 histograms become records in one
place, ``ProbeContext.histograms``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from prometheus_client import Counter

from jitterscope.collector.pacing import point
from jitterscope.schemas import events

if TYPE_CHECKING:
    from jitterscope.collector.probes.base import BccProbe
    from jitterscope.common.settings import Settings


@dataclass
class ProbeContext:
    """What a signal may use from the agent."""

    settings: Settings
    stamp: Any                                  # the agent's Stamp: header(kind, ts_ns), clock.to_epoch
    publish: Callable[[events.Record], None]    # queue one record for Kafka
    describe_process: Callable[[int], None]     # make sure a process's metadata is published
    comm_of: Callable[[int], str]               # a process's name now (or the last one known)
    topology: dict = field(default_factory=dict)  # collector.topology.read_topology's fields
    targets: set[int] | None = None             # None: every process is watched
    thresholds: dict[int, int] = field(default_factory=dict)  # pid -> its own runq event threshold (ns)
    # jitterscope's own processes, pid -> its role (collector, worker, broker,
    # up; the agent updates it in place): never victims, labelled as suspects
    own: dict[int, str] = field(default_factory=dict)
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    # a process that changed (moved to another cgroup): publish its record again now, not at the next rescan
    describe_again: Callable[[int], None] = lambda pid: None

    def record(self, record_type: type[events.Record], ts_ns: int, /, **fields) -> events.Record:
        """A ``record_type`` record with its stamp (``ts_ns`` in epoch ns)."""
        point()  # periodic records come by the thousand: a long run is offered up every 0.5 ms
        return record_type(**self.stamp.header(record_type, ts_ns), **fields)

    def event(self, record_type: type[events.Record], monotonic_ns: int, /, **fields) -> events.Record:
        """A record of a kernel event that carries CLOCK_MONOTONIC time."""
        return self.record(record_type, self.stamp.clock.to_epoch(monotonic_ns), **fields)

    def histograms(self, probe: str, deltas: dict[int, dict[int, int]], interval_ns: int,
                   now_ns: int) -> list[events.LatencyHistogram]:
        """pid -> {slot: count} (Log2Histograms.read) as LatencyHistogram records."""
        records = []
        for pid, slots in sorted(deltas.items()):
            ordered = sorted(slots.items())
            records.append(self.record(
                events.LatencyHistogram, now_ns, probe=probe, interval_ns=interval_ns, pid=pid,
                comm=self.comm_of(pid), slots=[s for s, _ in ordered], counts=[c for _, c in ordered]))
        return records


class Probe(ABC):
    """One signal. Subclasses set ``name`` and ``publishes`` and implement
    ``open`` and ``periodic``; the rest defaults to "nothing to do"."""

    name: ClassVar[str]
    publishes: ClassVar[tuple[type[events.Record], ...]]

    def __init__(self):
        self.events_read = 0           # kernel events taken one by one (ring buffer)

    @abstractmethod
    def open(self, context: ProbeContext) -> None:
        """Load and attach (or take the first reading)."""

    def set_targets(self, targets: set[int] | None, thresholds: dict[int, int]) -> None:
        """The processes to watch changed (None: all); only signals that
        filter by process act on it."""

    def rescan(self) -> None:
        """Periodic look at the host (every target_rescan_s)."""

    def poll(self, timeout_ms: int = 0) -> None:
        """Take the events the kernel queued; they go out through publish."""

    @abstractmethod
    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        """The records for the interval that ends now (epoch ``now_ns``)."""

    def forget(self, pids: set[int]) -> None:
        """Free what is kept for processes that have exited."""

    def drops(self) -> int:
        """Events lost because a ring buffer was full (cumulative)."""
        return 0

    def map_full_drops(self) -> int:
        """In-kernel map updates that failed (cumulative)."""
        return 0

    def targets_refused(self) -> int:
        """Processes it was asked to watch and had no room for (cumulative)."""
        return 0

    def bcc_probes(self) -> list[BccProbe]:
        """The loaded BPF programs this signal holds (none before open or
        after close)."""
        return []

    def close(self) -> None:
        """Detach and free; safe to call twice."""


class BccSignal(Probe):
    """A signal backed by one BccProbe, kept in ``self.probe``."""

    def __init__(self):
        super().__init__()
        self.probe: BccProbe | None = None

    def drops(self) -> int:
        return self.probe.drops() if self.probe else 0

    def map_full_drops(self) -> int:
        return self.probe.map_full_drops() if self.probe else 0

    def targets_refused(self) -> int:
        return self.probe.targets_refused if self.probe else 0

    def bcc_probes(self) -> list[BccProbe]:
        return [self.probe] if self.probe else []

    def close(self) -> None:
        if self.probe:
            self.probe.close()
            self.probe = None


class LatencySignal(BccSignal):
    """A BccSignal whose probe sends events as they happen and keeps
    per-process log2 latency histograms (run queue, GPU driver calls)."""

    def poll(self, timeout_ms: int = 0) -> None:
        if self.probe:
            self.probe.poll(timeout_ms)

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        if not self.probe:
            return []
        return self.ctx.histograms(self.name, self.probe.read_histograms(), interval_ns, now_ns)

    def forget(self, pids: set[int]) -> None:
        if self.probe:
            self.probe.forget_histograms(pids)


SIGNALS_DROPPED = Counter("jitterscope_collector_signals_dropped_total",
                          "signals closed after an error while running (the others keep running)", ["probe"])


def call_each(probes: list[Probe], what: str, call: Callable[[Probe], Any]) -> list[Any]:
    """``call(probe)`` for each probe, in order; their results. A probe that
    raises is logged, counted, closed and removed from ``probes``."""
    results = []
    for probe in list(probes):
        try:
            results.append(call(probe))
        except Exception as exc:
            logging.getLogger("jitterscope.collector").error(
                "a signal failed and was stopped; the others keep running", exc_info=True,
                extra={"fields": {"probe": probe.name, "during": what, "error": str(exc),
                                  "fix": "restart the collector to load it again; "
                                         "'jitterscope doctor' checks the host"}})
            SIGNALS_DROPPED.labels(probe.name).inc()
            probes.remove(probe)
            try:
                probe.close()
            except Exception:  # closing a broken probe may fail too: it is gone either way
                pass
    return results
