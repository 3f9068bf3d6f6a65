# SPDX-License-Identifier: Apache-2.0
"""NUMA placement rule for process records (topic jitterscope.processes):
an inference process may run on CPUs of another node than its GPU's. Pure:
no I/O."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, ProcessInfo, Topology
from jitterscope.schemas.topology import cpu_list
from jitterscope.streams.rules.base import alert, gpu_context


def cpu_off_gpu_node(process: ProcessInfo, topo: Topology, now_ns: int) -> Alert | None:
    """The process may run on CPUs of another node than its GPU's."""
    gpu, node, node_cpus = gpu_context(topo, process.gpus)
    if not gpu or not node_cpus:
        return None
    remote = sorted(set(process.cpus_allowed) - set(node_cpus))
    if not remote:
        return None
    summary = (f"{process.comm} (pid {process.pid}) uses GPU {gpu} on NUMA node {node} but may run on CPUs "
               f"{cpu_list(remote)} of other nodes: its host-side work and DMA buffers cross the socket link")
    remedy = (f"numactl --cpunodebind={node} --membind={node} <command>   "
              f"(running now: taskset -apc {cpu_list(node_cpus)} {process.pid})")
    return alert(process, "numa_cpu_mismatch", "warning", process.pid, process.comm, summary, remedy, now_ns,
                 {"gpu": gpu, "gpu_node": str(node), "gpu_node_cpus": cpu_list(node_cpus),
                  "remote_cpus": cpu_list(remote)}, cpus_allowed=process.cpus_allowed)
