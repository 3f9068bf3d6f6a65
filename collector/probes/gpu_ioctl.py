# SPDX-License-Identifier: Apache-2.0
"""The "gpu_ioctl" signal and its loader for bpf/gpu_ioctl.bpf.c: GPU driver
ioctl latency.

The kernel times only ioctls on (pid, fd) pairs the collector watches; find
them with `gpu_fds` (the fds processes hold open on GPU device files) and pass
them to `set_watched` whenever the process list is refreshed. Slow calls
arrive one by one through the ring buffer; every watched call is in the
per-process log2 histogram, which `read_histograms` turns into deltas since
the previous read (the kernel counters stay cumulative, so nothing is lost to
a read/clear race).
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from jitterscope.collector.device_watch import DeviceOpens
from jitterscope.collector.pacing import paced
from jitterscope.collector.probes import base
from jitterscope.collector.probes.interface import LatencySignal, ProbeContext
from jitterscope.common.settings import Settings
from jitterscope.schemas import events

# The one default is the setting's (gpu_device_patterns): each GPU's device
# file and /dev/nvidia-uvm (unified-memory faults and migrations go through it).
DEFAULT_PATTERNS = tuple(Settings.model_fields["gpu_device_patterns"].get_default(call_default_factory=True))
# nvidiactl carries the driver's control calls (not one GPU's work): left out
# even where a broader pattern (/dev/nvidia*) is configured.
DEFAULT_EXCLUDE = ("/dev/nvidiactl",)


@dataclass(frozen=True)
class RawGpuIoctl:
    """A ring-buffer record, monotonic time, as the kernel wrote it."""

    ts_ns: int          # when the call returned
    latency_ns: int
    pid: int            # tgid
    tid: int
    comm: str           # the calling thread's name
    fd: int
    request: int        # the ioctl command code
    ret: int            # the syscall's return value (negative errno on failure)


def gpu_fds(patterns: Iterable[str] = DEFAULT_PATTERNS, proc: Path = Path("/proc"),
            exclude: Iterable[str] = DEFAULT_EXCLUDE,
            pids: Iterable[int] | None = None) -> dict[tuple[int, int], str]:
    """{(pid, fd): device path} of open files matching the shell ``patterns``
    (fnmatch, so ``*`` also matches ``/``) and none of ``exclude``.

    ``pids`` limits the scan (the default reads every process's fd table).
    Processes and fds that vanish, or that this process may not read, are
    skipped.
    """
    patterns, exclude = tuple(patterns), tuple(exclude)
    if pids is None:
        try:
            pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
        except OSError:
            return {}
    found: dict[tuple[int, int], str] = {}
    for pid in paced(pids):  # every fd of every process: yields the CPU every 0.5 ms (pacing.py)
        fd_dir = proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(fd_dir / name)
            except OSError:
                continue
            if (any(fnmatch.fnmatchcase(target, p) for p in patterns)
                    and not any(fnmatch.fnmatchcase(target, p) for p in exclude)):
                found[(pid, int(name))] = target
    return found


def decode_event(e) -> RawGpuIoctl:
    """A ``struct gpu_ioctl_event`` (bpf/gpu_ioctl.h) as BCC's ctypes view gives it."""
    return RawGpuIoctl(e.ts_ns, e.latency_ns, e.pid, e.tid, base.c_string(bytes(e.comm)),
                       e.fd, e.request, e.ret)


class GpuIoctlProbe(base.LatencyProbe):
    source = "gpu_ioctl.bpf.c"
    decode = staticmethod(decode_event)

    def __init__(self, threshold_ns: int, watched: Iterable[tuple[int, int]] = ()):
        """``threshold_ns``: calls at least this long become events (the
        collector's default is 50 ms). ``watched``: (pid, fd) pairs to time."""
        super().__init__()
        self.threshold_ns = max(1, threshold_ns)  # 0 means "not configured" to the kernel
        self.set_watched(set(watched))
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        leaf.threshold_ns = self.threshold_ns
        config[ctypes.c_int(0)] = leaf

    def set_watched(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Time ioctls on exactly these (pid, fd) pairs from now on."""
        wanted = {(int(pid), int(fd)) for pid, fd in pairs}
        watched = self._bpf[b"watched"]
        current = {(k.pid, k.fd) for k in watched.keys()}
        for pid, fd in current - wanted:
            key = watched.Key(pid, fd)
            try:
                del watched[key]
            except KeyError:
                pass
        for pid, fd in wanted - current:
            watched[watched.Key(pid, fd)] = watched.Leaf(1)
        # Attached only while some fd is watched. A syscall tracepoint, once
        # attached, sends every syscall of every process on the host down
        # the kernel's slow (traced) path, whatever the program does: these
        # three made a getppid() loop 1.40-1.45x slower (bench/run.py
        # syscall-tracepoints). A host with no GPU user pays nothing.
        if self.attach_tracepoints(bool(wanted)) and not wanted:
            self._bpf[b"in_flight"].clear()  # calls entered before have no exit now: no stale start later

    def watched(self) -> set[tuple[int, int]]:
        return {(k.pid, k.fd) for k in self._bpf[b"watched"].keys()}


class GpuIoctlSignal(LatencySignal):
    """GPU driver calls on the device files of ``gpu_device_patterns``
    (settings ``gpu_ioctl_threshold_ms``, ``gpu_device_patterns``)."""

    name = "gpu_ioctl"
    publishes = (events.GpuIoctl, events.LatencyHistogram)

    def __init__(self):
        super().__init__()
        self._devices: dict[tuple[int, int], str] = {}  # (pid, fd) -> device path
        self._opens: DeviceOpens | None = None

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        self.patterns = list(context.settings.gpu_device_patterns)
        self.probe = GpuIoctlProbe(int(context.settings.gpu_ioctl_threshold_ms * 1_000_000))
        self.probe.open(self.on_event)
        self._opens = DeviceOpens(self.patterns)

    def on_event(self, raw: RawGpuIoctl) -> None:
        self.events_read += 1
        ctx = self.ctx
        ctx.describe_process(raw.pid)
        ctx.publish(ctx.event(
            events.GpuIoctl, raw.ts_ns, pid=raw.pid, tid=raw.tid, comm=raw.comm, fd=raw.fd,
            request=raw.request, latency_ns=raw.latency_ns, device=self._devices.get((raw.pid, raw.fd), "")))

    def rescan(self) -> None:
        """Find GPU device fds anew (processes open and close them), when a
        device file was opened or closed since the last look (device_watch.py)."""
        if not self.probe or not self._opens.due():
            return
        self._devices = gpu_fds(self.patterns, self.ctx.proc)
        self.probe.set_watched(self._devices.keys())
        # Every GPU user gets a process record (which GPUs, which CPUs),
        # slow calls or not: the placement rules judge them from it.
        for pid in sorted({pid for pid, _fd in self._devices}):
            self.ctx.describe_process(pid)

    def close(self) -> None:
        if self._opens:
            self._opens.close()
            self._opens = None
        super().close()
