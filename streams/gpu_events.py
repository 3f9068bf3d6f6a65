# SPDX-License-Identifier: Apache-2.0
"""What a request's GPU reported about itself during the request: the Xid
errors its driver logged (GpuXid, the xid signal) and the NVML slowdowns it
was under (GpuTelemetry with a power, thermal or hardware slowdown reason,
the nvml signal). Pure logic, no I/O; streams/attribution.py keeps one and
asks it per request.

Kernel evidence is charged by the time it took from a thread; these are
not: an Xid is a moment, a slowdown a state of the whole GPU. So they do not
compete with the CPU-side causes for the excess: they are named in every
attribution whose window they fall in (``gpu_xid``, ``gpu_throttle``), and
become the cause ("gpu_xid", then "gpu_throttle") only of a request whose
excess nothing on the CPU side explains.

Which GPU is a request's: those its serving group's processes hold open
(ProcessInfo.gpus, from /dev/nvidiaN in their file tables); where no process
record names one (not known yet, or the collector could not read the file
table), any GPU of the host, as the other evidence falls back to every
process of the host.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from jitterscope.schemas.events import GpuTelemetry, GpuXid
from jitterscope.schemas.gpu_health import SLOWDOWNS, slowdowns, xid_info

#: how far outside a request's window an Xid still counts: the kernel log's
#: clock (local_clock) is not CLOCK_MONOTONIC, which the collector converts
#: from; they were 0.6 ms apart on the build machine after 13 h up (NTP slews
#: only CLOCK_MONOTONIC, so they drift apart with uptime: docs/hardware.md)
XID_SLACK_NS = 2_000_000
#: records kept per host and kind: a storm of Xid lines (13 comes in threes) stays bounded
MAX_PER_HOST = 10_000


class _Timeline:
    """One host's records of one kind, sorted by time, with their starts."""

    def __init__(self):
        self.ends: list[int] = []
        self.records: list = []

    def add(self, end_ns: int, record) -> None:
        index = bisect.bisect_right(self.ends, end_ns)
        self.ends.insert(index, end_ns)
        self.records.insert(index, record)
        if len(self.records) > MAX_PER_HOST:
            del self.ends[:MAX_PER_HOST // 10]
            del self.records[:MAX_PER_HOST // 10]

    def expire(self, before_ns: int) -> None:
        cut = bisect.bisect_left(self.ends, before_ns)
        del self.ends[:cut]
        del self.records[:cut]

    def ending_within(self, start_ns: int, end_ns: int, longest_ns: int = 0) -> list:
        """The records whose end lies in [start, end + longest] (a record
        lasting up to ``longest_ns`` that ends after the request may still
        overlap it)."""
        return self.records[bisect.bisect_left(self.ends, start_ns):bisect.bisect_right(self.ends, end_ns + longest_ns)]


class GpuEvents:
    def __init__(self, horizon_ns: int = 300_000_000_000):
        self.horizon_ns = horizon_ns
        self._xids: dict[str, _Timeline] = defaultdict(_Timeline)
        self._slow: dict[str, _Timeline] = defaultdict(_Timeline)
        self._longest: dict[str, int] = defaultdict(int)  # the longest telemetry interval kept, per host

    def add(self, record: GpuXid | GpuTelemetry) -> None:
        if isinstance(record, GpuXid):
            self._xids[record.host].add(record.ts_ns, record)
        elif slowdowns(record.throttle):  # a reading without a slowdown has nothing to name
            self._slow[record.host].add(record.ts_ns, record)
            self._longest[record.host] = max(self._longest[record.host], record.interval_ns)
        else:
            return
        self._expire(record.host, record.ts_ns - self.horizon_ns)

    def _expire(self, host: str, before_ns: int) -> None:
        self._xids[host].expire(before_ns)
        self._slow[host].expire(before_ns)

    def during(self, host: str, gpus: set[str] | None, start_ns: int,
               end_ns: int) -> tuple[GpuXid | None, list[str], str]:
        """The first Xid on ``gpus`` (None: any of the host's) within
        [start, end], the slowdowns they were under at any moment of it
        (in SLOWDOWNS' order), and the GPU those name ("" for none)."""
        mine = (lambda pci: True) if gpus is None else gpus.__contains__
        xid = next((r for r in self._xids[host].ending_within(start_ns - XID_SLACK_NS, end_ns + XID_SLACK_NS)
                    if mine(r.pci)), None) \
            if host in self._xids else None
        found: set[str] = set()
        gpu = (xid.gpu or xid.pci) if xid else ""
        if host in self._slow:
            for r in self._slow[host].ending_within(start_ns, end_ns, self._longest[host]):
                if mine(r.pci) and r.ts_ns - r.interval_ns < end_ns:
                    found.update(slowdowns(r.throttle))
                    gpu = gpu or r.gpu or r.pci
        return xid, [name for name in SLOWDOWNS if name in found], gpu


def culprit(xid: GpuXid | None, throttle: list[str], gpu: str) -> str:
    """What the attribution's ``culprit`` says when the GPU is the cause."""
    if xid is not None:
        return f"Xid {xid.xid} on GPU {xid.gpu or xid.pci}: {xid_info(xid.xid).meaning}"
    return f"{', '.join(throttle)} on GPU {gpu}" if throttle else ""
