# SPDX-License-Identifier: Apache-2.0
"""GPU driver call rule (signal: the gpu_ioctl probe, topic
jitterscope.gpu_ioctl): a driver call slow enough to stall the GPU feed.
Pure: no I/O. (A slow call while a PCIe neighbour is busy is the block I/O
signal's finding: rules/blockio.py.)"""

from __future__ import annotations

from jitterscope.schemas.events import Alert, GpuIoctl, ProcessInfo, Topology
from jitterscope.schemas.nvidia import ioctl_name
from jitterscope.streams.rules.base import Thresholds, alert, gpu_context


def gpu_ioctl_stall(call: GpuIoctl, process: ProcessInfo | None, topo: Topology | None,
                    t: Thresholds, now_ns: int) -> Alert | None:
    if call.latency_ns < t.gpu_ioctl_ns:
        return None
    gpu, node, _ = gpu_context(topo, process.gpus) if topo and process else ("", -1, [])
    name = ioctl_name(call.request)  # NV_ESC_RM_CONTROL, UVM_MIGRATE, ... or 0x... when unknown
    summary = (f"{call.comm} (pid {call.pid}, tid {call.tid}): {'ioctl ' if name.startswith('0x') else ''}{name} "
               f"took {call.latency_ns / 1e6:.0f} ms (GPU driver call on {call.device or 'a GPU device'}"
               + (f", GPU {gpu} on node {node})" if gpu else ")"))
    remedy = ("check the GPU for throttling or errors (nvidia-smi -q -d PERFORMANCE,ECC; dmesg | grep -i xid) "
              "and for PCIe neighbours busy at the same time (see pcie_contention alerts)")
    return alert(call, "gpu_ioctl_stall", "critical" if call.latency_ns >= 4 * t.gpu_ioctl_ns else "warning",
                 call.pid, call.comm, summary, remedy, now_ns, {"gpu": gpu, "device": call.device,
                 "request": f"0x{call.request:x}", "call": name, "latency_ms": f"{call.latency_ns / 1e6:.1f}"},
                 tid=call.tid, duration_ns=call.latency_ns)
