"""The collector's hardware sources: GPU driver calls, CPU migrations, page
placement per NUMA node, and traffic of block devices and network interfaces,
each turned into records. The runq probe stays in agent.py; these share one
shape: poll often, flush on the histogram interval.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

from jitterscope.collector.probes.blockio import BlockIoProbe, device_name
from jitterscope.collector.probes.gpuioctl import GpuIoctlProbe, RawGpuIoctl, gpu_fds
from jitterscope.collector.probes.migrate import MigrationProbe
from jitterscope.collector.probes.pages import PageProbe
from jitterscope.collector.topology import PCI_ADDRESS
from jitterscope.schemas import events

log = logging.getLogger("jitterscope.collector.hardware")

MIN_PAGES = 256  # 1 MiB per interval: less page activity is not worth a record


def pci_of(sys_path: Path) -> str:
    """The PCI address a sysfs device sits under ("" when none): the last
    PCI-address component of its resolved path (virtio disks and NICs hang
    one level below their PCI function)."""
    try:
        parts = sys_path.resolve().parts
    except OSError:
        return ""
    return next((p for p in reversed(parts) if PCI_ADDRESS.fullmatch(p)), "")


class NetCounters:
    """Bytes and packets per network interface from sysfs counters (no BPF
    needed: the kernel keeps them), as deltas."""

    def __init__(self, sys: Path = Path("/sys")):
        self.sys = sys
        self._last: dict[str, tuple[int, int]] = {}

    def read(self) -> dict[str, tuple[int, int, str]]:
        out = {}
        base = self.sys / "class/net"
        for iface in sorted(os.listdir(base)) if base.is_dir() else []:
            device = base / iface / "device"
            if not device.exists():
                continue  # lo, bridges, veths: no hardware to contend with
            stats = base / iface / "statistics"
            try:
                total = sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))
                packets = sum(int((stats / f).read_text()) for f in ("rx_packets", "tx_packets"))
            except (OSError, ValueError):
                continue
            before = self._last.get(iface)
            self._last[iface] = (total, packets)
            if before is not None and total != before[0]:  # idle interfaces make no records
                out[iface] = (max(0, packets - before[1]), max(0, total - before[0]), pci_of(device))
        return out


class HardwareSources:
    def __init__(self, enabled: list[str], stamp, queue: Callable[[events.Record], None],
                 describe_process: Callable[[int], None], topology: dict, gpu_threshold_ns: int,
                 gpu_patterns: list[str], targets: set[int] | None, proc: Path = Path("/proc"),
                 sys: Path = Path("/sys")):
        self.stamp, self._queue, self._describe = stamp, queue, describe_process
        self.proc, self.sys = proc, sys
        self.gpu_patterns = gpu_patterns
        self._devices: dict[tuple[int, int], str] = {}  # (pid, fd) -> device path
        self.events_read = 0
        self.gpu = self.migrate = self.pages = self.blockio = self.net = None
        try:
            if "gpu_ioctl" in enabled:
                self.gpu = GpuIoctlProbe(gpu_threshold_ns)
                self.gpu.open(self._on_gpu_ioctl)
            if "migrate" in enabled:
                cpu_node = {c.cpu: c.node for c in topology["cpu_info"]}
                self.migrate = MigrationProbe(cpu_node, targets)
                self.migrate.open(lambda _cross_node: None)  # counted per thread; see read_counts
            if "pages" in enabled:
                ranges = [(n.node, start, end) for n in topology["numa_nodes"] for start, end in n.pfn_ranges]
                self.pages = PageProbe(ranges, proc)
            if "blockio" in enabled:
                self.blockio = BlockIoProbe()
            if "netdev" in enabled:
                self.net = NetCounters(sys)
                self.net.read()  # first read is the baseline
        except Exception:
            self.close()
            raise

    def _on_gpu_ioctl(self, raw: RawGpuIoctl) -> None:
        self.events_read += 1
        self._describe(raw.pid)
        self._queue(events.GpuIoctl(
            **self.stamp.header(events.GpuIoctl, self.stamp.clock.to_epoch(raw.ts_ns)), pid=raw.pid,
            tid=raw.tid, comm=raw.comm, fd=raw.fd, request=raw.request, latency_ns=raw.latency_ns,
            device=self._devices.get((raw.pid, raw.fd), "")))

    def poll(self) -> None:
        for probe in (self.gpu, self.migrate):
            if probe:
                probe.poll(0)

    def rescan(self, targets: set[int] | None) -> None:
        """Find GPU device fds anew (processes open and close them) and follow
        the runq probe's targets."""
        if self.gpu:
            self._devices = gpu_fds(self.gpu_patterns, self.proc)
            self.gpu.set_watched(self._devices.keys())
            # Every GPU user gets a process record (which GPUs, which CPUs),
            # slow calls or not: the placement rules judge them from it.
            for pid in sorted({pid for pid, _fd in self._devices}):
                self._describe(pid)
        if self.migrate and targets is not None:
            self.migrate.set_targets(targets)

    def flush(self, interval_ns: int, now_ns: int, comm_of: Callable[[int], str]) -> None:
        header = lambda kind: self.stamp.header(kind, now_ns)  # noqa: E731
        if self.gpu:
            for pid, slots in sorted(self.gpu.read_histograms().items()):
                ordered = sorted(slots.items())
                self._queue(events.LatencyHistogram(
                    **header(events.LatencyHistogram), probe="gpu_ioctl", interval_ns=interval_ns, pid=pid,
                    comm=comm_of(pid), slots=[s for s, _ in ordered], counts=[c for _, c in ordered]))
        if self.migrate:
            for tid, m in sorted(self.migrate.read_counts().items()):
                self._describe(m.pid)
                self._queue(events.Migrations(
                    **header(events.Migrations), pid=m.pid, tid=m.tid, comm=m.comm, interval_ns=interval_ns,
                    migrations=m.migrations, cross_node=m.cross_node, last_cpu=m.last_cpu))
        if self.pages:
            for (pid, node), p in sorted(self.pages.read().items()):
                if p.page_cache_pages + p.alloc_pages < MIN_PAGES:
                    continue
                self._describe(pid)
                self._queue(events.PagePlacement(
                    **header(events.PagePlacement), pid=pid, comm=p.comm, node=node if node != 255 else -1,
                    interval_ns=interval_ns, page_cache_pages=p.page_cache_pages, alloc_pages=p.alloc_pages))
        if self.blockio:
            for (major, minor), io in sorted(self.blockio.read().items()):
                name = device_name(major, minor, self.sys)
                self._queue(events.DeviceIo(
                    **header(events.DeviceIo), device=name, kind="block",
                    pci=pci_of(self.sys / f"dev/block/{major}:{minor}/device"), interval_ns=interval_ns,
                    ios=io.ios, bytes=io.bytes, latency_max_ns=io.latency_max_ns, latency_sum_ns=io.latency_sum_ns))
        if self.net:
            for iface, (packets, total, pci) in self.net.read().items():
                self._queue(events.DeviceIo(
                    **header(events.DeviceIo), device=iface, kind="net", pci=pci, interval_ns=interval_ns,
                    ios=packets, bytes=total))

    def forget(self, pids: set[int]) -> None:
        if self.gpu:
            self.gpu.forget_histograms(pids)
        if self.pages:
            self.pages.forget(pids)

    def drops(self) -> int:
        """Events lost to full ring buffers."""
        return sum(p.drops() for p in (self.gpu, self.migrate, self.pages, self.blockio) if p)

    def map_full_drops(self) -> int:
        """In-kernel map updates that failed (map full), over all probes."""
        return sum(p.map_full_drops() for p in (self.gpu, self.migrate, self.pages, self.blockio) if p)

    def close(self) -> None:
        for probe in (self.gpu, self.migrate, self.pages, self.blockio):
            if probe:
                probe.close()
