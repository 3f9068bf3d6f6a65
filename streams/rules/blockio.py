# SPDX-License-Identifier: Apache-2.0
"""PCIe contention rule (signal: the blockio/netdev device counters, topic
jitterscope.device_io, judged when a slow GPU driver call arrives): a device
on the GPU's PCIe switch moved a lot of data at the same time. Pure: no
I/O."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, DeviceIo, GpuIoctl, ProcessInfo, Topology
from jitterscope.schemas.topology import neighbours_of_gpu, shared_switch
from jitterscope.streams.rules.base import MB, Thresholds, alert


def pcie_contention(call: GpuIoctl, process: ProcessInfo | None, topo: Topology | None,
                    traffic: dict[str, DeviceIo], t: Thresholds, now_ns: int) -> Alert | None:
    """A slow GPU driver call while a device on the GPU's PCIe switch moves
    a lot of data. ``traffic``: the latest DeviceIo per PCI address."""
    if call.latency_ns < t.gpu_ioctl_ns or not topo or not process:
        return None
    for gpu in process.gpus:
        for neighbour in neighbours_of_gpu(topo, gpu):
            io = traffic.get(neighbour.address)
            if io is None:
                continue
            rate = io.bytes / max(io.interval_ns / 1e9, 1e-9)
            recent = io.ts_ns - io.interval_ns - 2_000_000_000 <= call.ts_ns <= io.ts_ns + io.interval_ns
            if rate < t.neighbour_bytes_per_s or not recent:
                continue
            switch = shared_switch(topo, gpu, neighbour.address) or "?"
            name = neighbour.name or neighbour.address
            summary = (f"{call.comm} (pid {call.pid}) waited {call.latency_ns / 1e6:.0f} ms in the GPU driver while "
                       f"{name} ({neighbour.kind}) moved {rate / MB:.0f} MiB/s through PCIe switch {switch}, "
                       f"shared with GPU {gpu}")
            remedy = (f"move the I/O on {name} to a device under another switch, or throttle it "
                      f"(ionice -c3, or cgroup io.max for its job), or schedule it off-peak")
            return alert(call, "pcie_contention", "critical", call.pid, call.comm, summary, remedy, now_ns,
                         {"gpu": gpu, "switch": switch, "neighbour": name, "neighbour_pci": neighbour.address,
                          "mib_per_s": f"{rate / MB:.0f}", "latency_ms": f"{call.latency_ns / 1e6:.1f}"},
                         tid=call.tid, duration_ns=call.latency_ns)
    return None
