# SPDX-License-Identifier: Apache-2.0
"""The "xid" signal: Xid errors the NVIDIA driver logs to the kernel log,
each mapped to its GPU by PCI address (no BPF program: the driver says it in
words). The kernel log is followed from the collector's start
(collector/kmsg.py); each NVRM Xid line becomes a GpuXid record stamped
with the kernel's time of the line, put on CLOCK_MONOTONIC where debugfs
says how far the log's clock is from it (collector/kmsg.py). The streams
worker raises an ``xid`` alert (streams/rules/xid.py) and names the Xid in
the attributions of the requests on that GPU (streams/gpu_events.py).

The line's form varies with the driver release; seen in the field:

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on ...
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu ...
    NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000
    NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff

The address names bus and device only (the GPU is function 0); the domain
may come with 4 or 8 digits. An NVRM Xid line of another shape is counted
(``unparsed``) and logged once, never raised: the kernel log is not ours.

Who wrote it: the driver's printk, so only a kernel-facility record
(facility 0, which no user-space write to /dev/kmsg gets, collector/kmsg.py)
whose message *starts* with ``NVRM: Xid (`` is one. Anyone can make the
kernel quote their words further in (``unshare -Urm mount -t tmpfs -o
'NVRM: Xid (PCI:0000:3b:00): 79' none /mnt`` logs "tmpfs: Unknown parameter
'NVRM: Xid ...'"), and a process name at the start of a kernel line is 15
characters, too short for a whole Xid header. Any other line with the text
is refused, counted (``refused``) and logged once: a forged "GPU fallen off
the bus" must not reach an alert or a request's cause.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Callable, NamedTuple

from jitterscope.collector.kmsg import KERNEL, KmsgFollower, KmsgRecord, clock_offset_ns
from jitterscope.collector.probes.interface import Probe, ProbeContext
from jitterscope.common.logs import fields
from jitterscope.schemas import events

log = logging.getLogger("jitterscope.collector.xid")

MARK = "NVRM: Xid"
PREFIX = "NVRM: Xid ("  # where the driver's line starts, and a forger's cannot
_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): "
                   r"(?P<xid>\d{1,5})\b,?\s*(?P<rest>.*)$")
_PID = re.compile(r"pid=(?:'?<unknown>'?|'?(?P<pid>\d+)'?),\s*")
_NAME = re.compile(r"name=(?P<name>[^,]*),\s*")


class XidLine(NamedTuple):
    xid: int
    pci: str  # sysfs form: 0000:3b:00.0
    pid: int
    comm: str
    message: str


def pci_address(text: str) -> str:
    """'0000:3b:00', '00000000:3B:00' or '0000:3b:00.0' -> '0000:3b:00.0'."""
    domain, bus, slot = text.lower().split(":")
    device, _, function = slot.partition(".")
    return f"{int(domain, 16):04x}:{bus}:{device}.{function or '0'}"


def parse_xid(message: str) -> XidLine | None:
    """An NVRM Xid line's parts (the line starts with it); None for any
    other line or shape."""
    found = _LINE.match(message)
    if found is None:
        return None
    xid = int(found.group("xid"))
    if xid > 0xFFFF:
        return None
    rest, pid, comm = found.group("rest"), 0, ""
    if (p := _PID.match(rest)) or (p := _PID.match(rest + ", ")):
        pid = int(p.group("pid") or 0)
        rest = rest[p.end():]
        if (n := _NAME.match(rest)) or (n := _NAME.match(rest + ", ")):
            comm = "" if n.group("name") == "<unknown>" else n.group("name")
            rest = rest[n.end():]
    return XidLine(xid, pci_address(found.group("pci")), pid if pid < 2**32 else 0, comm, rest.strip())


def from_driver(record: KmsgRecord) -> bool:
    """A kernel record (no user-space write) that starts with the driver's
    prefix (no quoted text inside another line)."""
    return record.facility == KERNEL and record.message.startswith(PREFIX)


class XidSignal(Probe):
    """NVRM Xid lines from /dev/kmsg as GpuXid records."""

    name = "xid"
    publishes = (events.GpuXid,)

    def __init__(self, path: str = "/dev/kmsg", read: Callable[[int, int], bytes] = os.read):
        super().__init__()
        self.path = path
        self._read = read  # the follower's read(2): tests stand in for the driver there
        self.follower: KmsgFollower | None = None
        self.unparsed = 0  # NVRM Xid lines of a shape parse_xid does not know
        self.refused = 0  # lines with the text that the driver did not write (from_driver)

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        try:
            self.follower = KmsgFollower(self.path, self._read)
        except OSError as exc:  # not root, a container without the host's /dev/kmsg, ProtectKernelLogs=yes
            log.warning("the kernel log cannot be read: no Xid errors will be reported",
                        extra=fields(path=self.path, error=str(exc),
                                     fix="run the collector as root with /dev/kmsg (in a systemd unit: no "
                                         "ProtectKernelLogs=yes, which hides it; jitterscope doctor checks)"))
        self.clock_offset_ns = clock_offset_ns() or 0  # kernel log clock -> CLOCK_MONOTONIC (0: unknown)
        # the GPUs by PCI address, as the topology names them (an NVML index or nvidiaN)
        self._gpus = {d.address: d.name for d in context.topology.get("pci", []) if d.kind == "gpu"}

    def poll(self, timeout_ms: int = 0) -> None:
        if self.follower is None:
            return
        try:
            records = self.follower.records()
        except OSError as exc:  # the log itself failed (EIO): say so once, and stop following it
            log.error("the kernel log failed: no more Xid errors will be reported", extra=fields(error=str(exc)))
            self.close()
            return
        for record in records:
            if MARK not in record.message:
                continue
            if not from_driver(record):
                self.refused += 1
                if self.refused == 1:  # one line, then the count says the rest
                    log.warning("an Xid line the NVIDIA driver did not write (refused, counted)",
                                extra=fields(facility=record.facility, line=record.message[:200]))
                continue
            line = parse_xid(record.message)
            if line is None:
                self.unparsed += 1
                if self.unparsed == 1:  # one line, then the count says the rest
                    log.warning("an NVRM Xid line of an unknown shape (counted, not reported)",
                                extra=fields(line=record.message[:200]))
                continue
            self.events_read += 1
            if line.pid:
                self.ctx.describe_process(line.pid)
            self.ctx.publish(self.ctx.event(
                events.GpuXid, record.usec * 1000 + self.clock_offset_ns, xid=line.xid, pci=line.pci,
                gpu=self._gpus.get(line.pci, ""), pid=line.pid, comm=line.comm, message=line.message))

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        if self.follower is not None:  # the clocks drift apart: follow them
            self.clock_offset_ns = clock_offset_ns() or self.clock_offset_ns
        return []

    def close(self) -> None:
        if self.follower:
            if self.follower.lost:  # any kernel lines, Xid or not: not the probes' drops
                log.warning("kernel log records were overwritten before they were read",
                            extra=fields(lost=self.follower.lost))
            self.follower.close()
            self.follower = None
