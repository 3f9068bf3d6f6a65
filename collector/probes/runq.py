"""The "runq" signal (always on) and its loader for bpf/runqlat.bpf.c:
run-queue latency with the first suspect.

Tail waits arrive one by one through the ring buffer; every wait is in the
per-process log2 histogram, which `read_histograms` turns into deltas since
the previous read (the kernel counters stay cumulative, so nothing is lost to a
read/clear race).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from jitterscope.collector import hostinfo
from jitterscope.collector.probes import base
from jitterscope.collector.probes.interface import LatencySignal, ProbeContext
from jitterscope.schemas import events


@dataclass(frozen=True)
class RawRunqEvent:
    """A ring-buffer record, monotonic time, as the kernel wrote it."""

    ts_ns: int
    wait_ns: int
    pid: int
    tid: int
    cpu: int
    suspect_pid: int
    suspect_tid: int
    comm: str
    suspect_comm: str


def decode_event(e) -> RawRunqEvent:
    """A ``struct runq_event`` (bpf/runqlat.h) as BCC's ctypes view gives it."""
    return RawRunqEvent(e.ts_ns, e.wait_ns, e.pid, e.tid, e.cpu, e.suspect_pid, e.suspect_tid,
                        base.c_string(bytes(e.comm)), base.c_string(bytes(e.suspect_comm)))


class RunqProbe(base.LatencyProbe):
    source = "runqlat.bpf.c"
    decode = staticmethod(decode_event)

    def __init__(self, threshold_ns: int, target_pids: set[int] | None = None,
                 thresholds: dict[int, int] | None = None):
        """``target_pids`` None watches every process; ``thresholds`` gives
        some processes their own event threshold (ns)."""
        super().__init__()
        self.threshold_ns = max(1, threshold_ns)  # 0 means "not configured" to the kernel
        self.filtering = target_pids is not None
        self.set_targets(target_pids or set(), thresholds or {})

    def set_targets(self, pids: set[int], thresholds: dict[int, int] | None = None) -> None:
        """Watch ``pids`` (when filtering) and apply per-process thresholds."""
        thresholds = thresholds or {}
        wanted = {pid: thresholds.get(pid, 0) for pid in (pids if self.filtering else set())}
        wanted.update(thresholds)
        targets = self._bpf[b"targets"]
        current = {k.value: v.value for k, v in targets.items()}
        for pid in current.keys() - wanted.keys():
            del targets[targets.Key(pid)]
        for pid, ns in wanted.items():
            if current.get(pid) != ns:
                targets[targets.Key(pid)] = targets.Leaf(ns)
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        leaf.threshold_ns = self.threshold_ns
        leaf.filter_targets = int(self.filtering)
        leaf.has_overrides = int(bool(thresholds))
        config[ctypes.c_int(0)] = leaf


class RunqSignal(LatencySignal):
    """The run-queue signal: tail waits one by one, every wait in histograms.
    Always on (not one of the ``hardware_probes``)."""

    name = "runq"
    publishes = (events.RunqEvent, events.LatencyHistogram)
    metric_label = "runqlat"

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        s = context.settings
        self.probe = RunqProbe(int(s.runq_threshold_ms * 1_000_000), context.targets, context.thresholds)
        self.probe.open(self.on_event)

    def on_event(self, raw: RawRunqEvent) -> None:
        self.events_read += 1
        ctx = self.ctx
        pid = raw.pid or hostinfo.tgid_of(raw.tid, ctx.proc) or raw.tid
        ctx.describe_process(pid)
        ctx.describe_process(raw.suspect_pid)
        ctx.publish(ctx.event(
            events.RunqEvent, raw.ts_ns, pid=pid, tid=raw.tid, comm=raw.comm, cpu=raw.cpu,
            wait_ns=raw.wait_ns, suspect_pid=raw.suspect_pid, suspect_tid=raw.suspect_tid,
            suspect_comm=raw.suspect_comm))

    def set_targets(self, targets: set[int] | None, thresholds: dict[int, int]) -> None:
        if self.probe:
            self.probe.set_targets(targets or set(), thresholds)

