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


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


class RunqProbe:
    def __init__(self, threshold_ns: int, target_pids: set[int] | None = None,
                 thresholds: dict[int, int] | None = None):
        """``target_pids`` None watches every process; ``thresholds`` gives
        some processes their own event threshold (ns)."""
        self._bpf = base.load("runqlat.bpf.c")
        self._hist_seen: dict[tuple[int, int], int] = {}
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
                _text(bytes(e.comm)), _text(bytes(e.suspect_comm)),
            ))

        table.open_ring_buffer(callback)

    def poll(self, timeout_ms: int) -> None:
        self._bpf.ring_buffer_poll(timeout_ms)

    def drops(self) -> int:
        return sum(self._bpf[b"drops"][ctypes.c_int(0)])

    def read_histograms(self) -> dict[int, dict[int, int]]:
        """pid -> {slot: new waits since the last read}."""
        hist = self._bpf[b"hist"]
        deltas: dict[int, dict[int, int]] = {}
        alive: dict[tuple[int, int], int] = {}
        for key, value in hist.items():
            ident = (key.pid, key.slot)
            alive[ident] = value.value
            delta = value.value - self._hist_seen.get(ident, 0)
            if delta > 0:
                deltas.setdefault(key.pid, {})[key.slot] = delta
        self._hist_seen = alive
        return deltas

    def forget_histograms(self, pids: set[int]) -> None:
        """Drop kernel counters of processes that have exited (bounded map)."""
        hist = self._bpf[b"hist"]
        for key in list(hist.keys()):
            if key.pid in pids:
                del hist[key]
                self._hist_seen.pop((key.pid, key.slot), None)

    def close(self) -> None:
        self._bpf.cleanup()

    def __enter__(self) -> "RunqProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
