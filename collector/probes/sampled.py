# SPDX-License-Identifier: Apache-2.0
"""Signals read on their own clock, shorter than the histogram interval.

IRQ time and CFS throttling are charged to run-queue waits of a few
milliseconds (streams/attribution.py, the run-queue rule); a 10 s histogram
interval would smear a 200 ms interrupt storm or throttling burst over fifty
times its length. Such a signal is read every ``interval_s`` by a thread of
its own: the agent's loop can stall for seconds (target rescans of /proc,
stack symbolization on a loaded host), and a sampler that waited for it
would stretch its intervals to match. The thread only reads the kernel's
counters (``read``); the records are made and published on the agent's
thread, in ``poll`` (stamps and batches are not thread-safe). The agent's
``periodic`` call (and the last one at shutdown) also takes what has
accumulated since the last reading, so nothing is lost or counted twice.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import abstractmethod
from typing import Any

from jitterscope.collector.probes.interface import Probe, ProbeContext
from jitterscope.schemas import events


class SampledSignal(Probe):
    """Subclasses call ``start_clock`` at the end of ``open`` and implement
    ``read`` (sampler thread) and ``records`` (agent thread); ``lock`` guards
    state both touch."""

    def start_clock(self, context: ProbeContext, interval_s: float) -> None:
        self.ctx = context
        self.lock = threading.Lock()
        self._interval_s = interval_s
        self._last_ns = time.monotonic_ns()
        self._readings: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-sampler", daemon=True)
        self._thread.start()

    @abstractmethod
    def read(self) -> Any:
        """Take the counters' change since the previous read (sampler thread, under ``lock``)."""

    @abstractmethod
    def records(self, reading: Any, interval_ns: int, now_ns: int) -> list[events.Record]:
        """One reading as records for the ``interval_ns`` that ended at epoch ``now_ns``."""

    def _take(self) -> None:
        with self.lock:
            mono, now = time.monotonic_ns(), time.time_ns()
            reading = self.read()
            interval, self._last_ns = mono - self._last_ns, mono
        self._readings.put((reading, interval, now))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._take()
            except Exception:  # a cgroup or map that went away mid-read: the next reading retries
                continue

    def _drain(self) -> list[events.Record]:
        out = []
        while True:
            try:
                reading, interval, now = self._readings.get_nowait()
            except queue.Empty:
                return out
            out.extend(self.records(reading, interval, now))

    def poll(self, timeout_ms: int = 0) -> None:
        if hasattr(self, "_readings"):
            for record in self._drain():
                self.ctx.publish(record)

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        """The readings not yet published, and what accumulated since the last one."""
        if not hasattr(self, "_readings"):
            return []
        if self._thread.is_alive():
            self._take()
        return self._drain()

    def close(self) -> None:
        if hasattr(self, "_stop"):
            self._stop.set()
            self._thread.join()
        super().close()
