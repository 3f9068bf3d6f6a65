# SPDX-License-Identifier: Apache-2.0
"""Questions about a host's topology, answered from a ``Topology`` record
(anything with its ``numa_nodes``, ``cpu_info`` and ``pci``), and the kernel's
cpulist format both ways. Pure functions: no /sys, no /proc. The collector
reads the record (collector/topology.py); the streams rules and the reports
ask it questions.
"""

from __future__ import annotations

from jitterscope.schemas.events import PciDevice, Topology


# --- CPU lists ------------------------------------------------------------------


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def cpu_list(cpus) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> '0-3,8,10-11' (the kernel's cpulist format,
    what taskset -c and numactl --physcpubind take)."""
    parts = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu != run[-1] + 1:
            parts.append(_run(run))
            run = []
        run.append(cpu)
    if run:
        parts.append(_run(run))
    return ",".join(parts)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


# --- PCI addresses and the questions the rules ask ------------------------------


def normalize_pci_address(address: str | bytes) -> str:
    """NVML's '00000000:3B:00.0' (or bytes) -> sysfs's '0000:3b:00.0'."""
    if isinstance(address, bytes):
        address = address.decode()
    domain, bus, slot = address.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{slot}"


def node_of_cpu(topo: Topology, cpu: int) -> int:
    """The NUMA node of ``cpu``; -1 when the topology does not know it."""
    for info in topo.cpu_info:
        if info.cpu == cpu:
            return info.node
    return next((n.node for n in topo.numa_nodes if cpu in n.cpus), -1)


def cpus_of_node(topo: Topology, node: int) -> list[int]:
    return next((list(n.cpus) for n in topo.numa_nodes if n.node == node), [])


def node_of_pfn(topo: Topology, pfn: int) -> int:
    """The NUMA node whose zones span page frame ``pfn``; -1 if none does."""
    for n in topo.numa_nodes:
        if any(start <= pfn < end for start, end in n.pfn_ranges):
            return n.node
    return -1


def pci_device(topo: Topology, address: str) -> PciDevice | None:
    address = normalize_pci_address(address)
    return next((d for d in topo.pci if d.address == address), None)


def gpu_by_address(topo: Topology, address: str) -> PciDevice | None:
    """The GPU at ``address`` (sysfs or NVML spelling), or None."""
    device = pci_device(topo, address)
    return device if device is not None and device.kind == "gpu" else None


def shared_switch(topo: Topology, a_address: str, b_address: str) -> str | None:
    """The deepest bridge below the root port that both devices sit under,
    i.e. the PCIe switch whose uplink they share; None when they share only
    the root complex (or root port: one link, so functions of one card)."""
    a, b = pci_device(topo, a_address), pci_device(topo, b_address)
    if a is None or b is None:
        return None
    common = 0
    while common < min(len(a.upstream), len(b.upstream)) and a.upstream[common] == b.upstream[common]:
        common += 1
    return a.upstream[common - 1] if common >= 2 else None


def neighbours_of_gpu(topo: Topology, gpu_address: str) -> list[PciDevice]:
    """NVMe controllers and NICs behind the same PCIe switch as the GPU: their
    DMA competes with the GPU's for the switch's uplink."""
    return [d for d in topo.pci if d.kind in ("nvme", "nic") and shared_switch(topo, gpu_address, d.address)]


def gpu_node(topo: Topology, gpu_address: str) -> int:
    """The GPU's NUMA node. Firmware that leaves numa_node at -1 usually does so
    for a whole device; another device under the same host bridge (root bus)
    that has a node is then the best witness, since the node belongs to the
    host bridge. -1 when nothing says."""
    gpu = gpu_by_address(topo, gpu_address)
    if gpu is None:
        return -1
    if gpu.numa_node >= 0:
        return gpu.numa_node
    root = _root_bus(gpu)
    return next((d.numa_node for d in topo.pci if d.numa_node >= 0 and _root_bus(d) == root), -1)


def _root_bus(device: PciDevice) -> str:
    """'0000:80' for anything below root port 0000:80:01.0."""
    return (device.upstream[0] if device.upstream else device.address).rsplit(":", 1)[0]
