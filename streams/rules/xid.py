# SPDX-License-Identifier: Apache-2.0
"""Xid rule (signal: the xid probe, topic jitterscope.gpu_xid): every Xid
error the NVIDIA driver logged is an ``xid`` alert naming the GPU (its
topology name, NUMA node), the process the driver named, NVIDIA's meaning
of the code and its remedy (schemas/gpu_health.py). Pure: no I/O. The
requests on that GPU at that moment name the Xid in their attributions
(streams/gpu_events.py)."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, GpuXid
from jitterscope.schemas.gpu_health import xid_info
from jitterscope.schemas.topology import gpu_by_address, gpu_node
from jitterscope.streams.rules.base import Thresholds, alert


def judge(record: GpuXid, state, t: Thresholds, now_ns: int) -> Alert | None:
    topo = state.topology.get(record.host) if state is not None else None
    device = gpu_by_address(topo, record.pci) if topo is not None else None
    node = gpu_node(topo, record.pci) if topo is not None and device is not None else -1
    name = record.gpu or (device.name if device is not None else "")
    info = xid_info(record.xid)
    if device is None and not name:
        where = f"the GPU at {record.pci} (not in this host's topology)"
    else:
        where = f"GPU {name or record.pci} ({record.pci}" + (f", node {node})" if node >= 0 else ")")
    who = f", process {record.comm or '?'} (pid {record.pid})" if record.pid else ""
    summary = f"Xid {record.xid} on {where}{who}: {info.meaning}" + (f" [{record.message}]" if record.message else "")
    return alert(record, "xid", info.severity, record.pid, record.comm, summary, info.remedy, now_ns,
                 {"xid": str(record.xid), "gpu": name, "pci": record.pci, "message": record.message})


def repeat_key(record: GpuXid) -> tuple:
    """The same code on the same GPU is one finding per quiet period (13
    comes in threes, 45 once per channel of the application)."""
    return (record.pci, record.xid)
