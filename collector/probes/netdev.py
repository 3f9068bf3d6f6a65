# SPDX-License-Identifier: Apache-2.0
"""The "netdev" signal: bytes and packets per network interface, from the
kernel's own sysfs counters (no BPF program: the kernel keeps them), as
deltas per histogram interval. Interfaces without a device (lo, bridges,
veths) have no hardware to contend with and are left out; idle ones make no
record.
"""

from __future__ import annotations

import os
from pathlib import Path

from jitterscope.collector.probes.interface import Probe, ProbeContext
from jitterscope.collector.topology import PCI_ADDRESS
from jitterscope.schemas import events


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
    """Bytes and packets per network interface from sysfs counters, as deltas."""

    def __init__(self, sys: Path = Path("/sys")):
        self.sys = sys
        self._last: dict[str, tuple[int, int]] = {}

    def read(self) -> dict[str, tuple[int, int, str]]:
        """iface -> (packets, bytes, pci) since the previous read (the first
        read is the baseline and returns nothing)."""
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


class NetdevSignal(Probe):
    name = "netdev"
    publishes = (events.DeviceIo,)

    def __init__(self):
        super().__init__()
        self.counters: NetCounters | None = None

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        self.counters = NetCounters(context.sys)
        self.counters.read()  # the first read is the baseline

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        if not self.counters:
            return []
        return [self.ctx.record(events.DeviceIo, now_ns, device=iface, kind="net", pci=pci,
                                interval_ns=interval_ns, ios=packets, bytes=total)
                for iface, (packets, total, pci) in self.counters.read().items()]

    def close(self) -> None:
        self.counters = None
