"""Loader for bpf/runqlat.bpf.c: run-queue latency with the first suspect.

Tail waits arrive one by one through the ring buffer; every wait is in the
per-process log2 histogram, which `read_histograms` turns into deltas since
the previous read (the kernel counters stay cumulative, so nothing is lost to a
read/clear race).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

from jitterscope.collector.probes import base


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


class RunqProbe(base.BccProbe):
    source = "runqlat.bpf.c"

    def __init__(self, threshold_ns: int, target_pids: set[int] | None = None,
                 thresholds: dict[int, int] | None = None):
        """``target_pids`` None watches every process; ``thresholds`` gives
        some processes their own event threshold (ns)."""
        super().__init__()
        self.histograms = base.Log2Histograms(self._bpf[b"hist"])
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

    def open(self, on_event: Callable[[RawRunqEvent], None]) -> None:
        table = self._bpf[b"events"]

        def callback(_ctx, data, _size):
            e = table.event(data)
            on_event(RawRunqEvent(
                e.ts_ns, e.wait_ns, e.pid, e.tid, e.cpu, e.suspect_pid, e.suspect_tid,
                base.c_string(bytes(e.comm)), base.c_string(bytes(e.suspect_comm)),
            ))

        table.open_ring_buffer(callback)

    def read_histograms(self) -> dict[int, dict[int, int]]:
        """pid -> {slot: new waits since the last read}."""
        return self.histograms.read()

    def forget_histograms(self, pids: set[int]) -> None:
        """Drop kernel counters of processes that have exited (bounded map)."""
        self.histograms.forget(pids)
