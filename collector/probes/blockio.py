# SPDX-License-Identifier: Apache-2.0
"""The "blockio" signal and its loader for bpf/blockio.bpf.c: I/Os, bytes and
latency of each block device.

`read` returns per-device deltas since the previous read; the kernel's sums
stay cumulative (nothing is lost to a read/clear race) and its maximum is
kept per interval by an epoch the read bumps (see bpf/blockio.h). Devices are
whole disks, as the block layer names them: (major, minor) of nvme0n1, not
of nvme0n1p1; `disks_of` maps a file's st_dev there.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from jitterscope.collector.probes import base
from jitterscope.collector.probes.interface import BccSignal, ProbeContext
from jitterscope.collector.probes.netdev import pci_of
from jitterscope.schemas import events

MINOR_BITS = 20  # the kernel's dev_t: major << 20 | minor


@dataclass(frozen=True)
class RawBlockIo:
    """One device's completed requests since the previous read."""

    major: int
    minor: int
    ios: int
    bytes: int
    latency_sum_ns: int     # issue -> completion, over the ios
    latency_max_ns: int     # the slowest of them
    errors: int             # of which completed with an error


def disks_of(st_dev: int, sys: Path = Path("/sys")) -> list[tuple[int, int]]:
    """(major, minor) of the disks whose requests carry a file's I/O, from a
    user-space dev_t (a file's ``st_dev``): a partition's parent disk, the
    disks under a stacked device (LVM/device-mapper, md RAID: bio-based, so
    the block_rq tracepoints see only the disks below), or the device itself.
    """
    return sorted(_disks(os.major(st_dev), os.minor(st_dev), sys, depth=0))


def _disks(major: int, minor: int, sys: Path, depth: int) -> set[tuple[int, int]]:
    node = sys / "dev/block" / f"{major}:{minor}"
    if depth > 8 or not node.exists():
        return {(major, minor)}
    try:
        real = node.resolve()
        if (real / "partition").exists():
            parent = _dev(real.parent / "dev")
            return _disks(*parent, sys, depth + 1) if parent else {(major, minor)}
        below: set[tuple[int, int]] = set()
        for slave in sorted((real / "slaves").iterdir()) if (real / "slaves").is_dir() else []:
            dev = _dev(slave / "dev")
            if dev:
                below |= _disks(*dev, sys, depth + 1)
        return below or {(major, minor)}
    except OSError:
        return {(major, minor)}


def _dev(path: Path) -> tuple[int, int] | None:
    try:
        major, minor = path.read_text().strip().split(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        return None


def device_name(major: int, minor: int, sys: Path = Path("/sys")) -> str:
    """The kernel's name of a block device (nvme0n1, vda), "" if unknown."""
    try:
        for line in (sys / "dev/block" / f"{major}:{minor}" / "uevent").read_text().splitlines():
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return ""


class BlockIoProbe(base.BccProbe):
    source = "blockio.bpf.c"

    def __init__(self):
        super().__init__()
        self._seen: dict[int, tuple[int, int, int, int]] = {}  # dev -> (ios, bytes, sum, errors)
        self._epoch = 1
        self._write_epoch()

    def _write_epoch(self) -> None:
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        leaf.epoch = self._epoch
        config[ctypes.c_int(0)] = leaf

    def read(self) -> dict[tuple[int, int], RawBlockIo]:
        """(major, minor) -> requests completed since the last read (idle devices are left out)."""
        closing = self._epoch
        self._epoch = self._epoch % 0xFFFFFFFF + 1  # never 0: that means "not configured"
        self._write_epoch()
        result, self._seen = diff_stats(self._bpf[b"stats"].items(), self._seen, closing)
        return result


def diff_stats(entries, seen: dict[int, tuple[int, int, int, int]], closing: int
               ) -> tuple[dict[tuple[int, int], RawBlockIo], dict[int, tuple[int, int, int, int]]]:
    """The kernel's cumulative per-CPU ``stats`` entries ((dev key, [struct
    blockio_stats per CPU]) pairs, bpf/blockio.h) as per-device deltas
    against ``seen`` (dev -> (ios, bytes, latency sum, errors)); the maximum
    is the one kept for the ``closing`` epoch. Returns (deltas, new seen)."""
    slot = closing & 1
    result: dict[tuple[int, int], RawBlockIo] = {}
    now_seen: dict[int, tuple[int, int, int, int]] = {}
    for key, per_cpu in entries:
        dev = key.value
        ios = sum(s.ios for s in per_cpu)
        nbytes = sum(s.bytes for s in per_cpu)
        total = sum(s.latency_sum_ns for s in per_cpu)
        errors = sum(s.errors for s in per_cpu)
        worst = max((s.max_ns[slot] for s in per_cpu if s.max_epoch[slot] == closing), default=0)
        now_seen[dev] = (ios, nbytes, total, errors)
        b_ios, b_bytes, b_total, b_errors = seen.get(dev, (0, 0, 0, 0))
        if ios > b_ios or nbytes > b_bytes:
            major, minor = dev >> MINOR_BITS, dev & ((1 << MINOR_BITS) - 1)
            result[(major, minor)] = RawBlockIo(major, minor, ios - b_ios, nbytes - b_bytes,
                                                total - b_total, worst, errors - b_errors)
    return result, now_seen


class BlockIoSignal(BccSignal):
    """I/Os, bytes and latency per block device (whole disks)."""

    name = "blockio"
    publishes = (events.DeviceIo,)

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        self.probe = BlockIoProbe()

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        if not self.probe:
            return []
        sys = self.ctx.sys
        return [self.ctx.record(
            events.DeviceIo, now_ns, device=device_name(major, minor, sys), kind="block",
            pci=pci_of(sys / f"dev/block/{major}:{minor}/device"), interval_ns=interval_ns,
            ios=io.ios, bytes=io.bytes, latency_max_ns=io.latency_max_ns, latency_sum_ns=io.latency_sum_ns)
            for (major, minor), io in sorted(self.probe.read().items())]
