"""Alert rules for GPU, NUMA, migration and PCIe evidence, judged against the
host's real topology. Pure functions: evidence + topology + process in,
Alert (with a remedy an operator can paste) or None out.

Each remedy names this host's own nodes, CPUs and devices: the GPU's NUMA
node and its CPU list, the switch a GPU shares with an NVMe drive, the node
a noisy job should move to.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitterscope.schemas.topology import (
    cpu_list, cpus_of_node, gpu_by_address, gpu_node, neighbours_of_gpu, shared_switch,
)
from jitterscope.schemas.events import Alert, DeviceIo, GpuIoctl, Migrations, PagePlacement, ProcessInfo, Topology

MB = 1 << 20
PAGE = 4096


@dataclass(frozen=True)
class Thresholds:
    gpu_ioctl_ns: int = 50_000_000  # a driver call this slow stalls the GPU feed
    migrations_per_s: float = 50.0  # a thread hopping cores this often loses its caches
    remote_share: float = 0.5  # of an inference process's new pages on a node away from its GPU
    remote_min_pages: int = 25_600  # 100 MiB: below that, placement is noise
    filler_bytes_per_s: float = 50 * MB  # page cache another process adds to a GPU's node
    neighbour_bytes_per_s: float = 200 * MB  # NVMe/NIC traffic that contends on a shared switch


def _alert(record, kind: str, severity: str, pid: int, comm: str, summary: str, remedy: str, now_ns: int,
           evidence: dict[str, str], tid: int = 0, cpus_allowed: list[int] | None = None,
           duration_ns: int = 0) -> Alert:
    return Alert(host=record.host, boot_id=record.boot_id, seq=record.seq, ts_ns=record.ts_ns, raised_ns=now_ns,
                 kind=kind, severity=severity, pid=pid, tid=tid, comm=comm, cpu=0, wait_ns=duration_ns,
                 suspect_pid=0, suspect_comm="", cpus_allowed=cpus_allowed or [], summary=summary,
                 remedy=remedy, evidence=evidence)


def _gpu_context(topo: Topology, gpus: list[str]) -> tuple[str, int, list[int]]:
    """The process's first GPU, its node and that node's CPUs (or "", -1, [])."""
    for address in gpus:
        if gpu_by_address(topo, address):
            node = gpu_node(topo, address)
            return address, node, cpus_of_node(topo, node) if node >= 0 else []
    return "", -1, []


def gpu_ioctl_stall(call: GpuIoctl, process: ProcessInfo | None, topo: Topology | None,
                    t: Thresholds, now_ns: int) -> Alert | None:
    if call.latency_ns < t.gpu_ioctl_ns:
        return None
    gpu, node, _ = _gpu_context(topo, process.gpus) if topo and process else ("", -1, [])
    summary = (f"{call.comm} (pid {call.pid}, tid {call.tid}) waited {call.latency_ns / 1e6:.0f} ms in a GPU "
               f"driver call (ioctl 0x{call.request:x} on {call.device}"
               + (f", GPU {gpu} on node {node})" if gpu else ")"))
    remedy = ("check the GPU for throttling or errors (nvidia-smi -q -d PERFORMANCE,ECC; dmesg | grep -i xid) "
              "and for PCIe neighbours busy at the same time (see pcie_contention alerts)")
    return _alert(call, "gpu_ioctl_stall", "critical" if call.latency_ns >= 4 * t.gpu_ioctl_ns else "warning",
                  call.pid, call.comm, summary, remedy, now_ns, {"gpu": gpu, "device": call.device,
                  "request": f"0x{call.request:x}", "latency_ms": f"{call.latency_ns / 1e6:.1f}"},
                  tid=call.tid, duration_ns=call.latency_ns)


def cpu_off_gpu_node(process: ProcessInfo, topo: Topology, now_ns: int) -> Alert | None:
    """The process may run on CPUs of another node than its GPU's."""
    gpu, node, node_cpus = _gpu_context(topo, process.gpus)
    if not gpu or not node_cpus:
        return None
    remote = sorted(set(process.cpus_allowed) - set(node_cpus))
    if not remote:
        return None
    summary = (f"{process.comm} (pid {process.pid}) uses GPU {gpu} on NUMA node {node} but may run on CPUs "
               f"{cpu_list(remote)} of other nodes: its host-side work and DMA buffers cross the socket link")
    remedy = (f"numactl --cpunodebind={node} --membind={node} <command>   "
              f"(running now: taskset -apc {cpu_list(node_cpus)} {process.pid})")
    return _alert(process, "numa_cpu_mismatch", "warning", process.pid, process.comm, summary, remedy, now_ns,
                  {"gpu": gpu, "gpu_node": str(node), "gpu_node_cpus": cpu_list(node_cpus),
                   "remote_cpus": cpu_list(remote)}, cpus_allowed=process.cpus_allowed)


def _pages(p: PagePlacement) -> int:
    return p.page_cache_pages + p.alloc_pages


def remote_memory(process: ProcessInfo, placements: list[PagePlacement], topo: Topology,
                  t: Thresholds, now_ns: int) -> Alert | None:
    """An inference process's new pages land mostly away from its GPU's node.
    ``placements``: its records of one interval, one per node."""
    gpu, node, _ = _gpu_context(topo, process.gpus)
    total = sum(_pages(p) for p in placements)
    if not gpu or total < t.remote_min_pages:
        return None
    remote = sum(_pages(p) for p in placements if p.node != node)
    if remote / total < t.remote_share:
        return None
    biggest = max((p for p in placements if p.node != node), key=_pages)
    summary = (f"{process.comm} (pid {process.pid}) put {remote * PAGE / MB:.0f} MiB of {total * PAGE / MB:.0f} MiB "
               f"new memory on node {biggest.node}, away from its GPU {gpu} on node {node}")
    remedy = (f"numactl --cpunodebind={node} --membind={node} <command>; to move what is there now: "
              f"migratepages {process.pid} {biggest.node} {node}")
    return _alert(biggest, "numa_remote_memory", "warning", process.pid, process.comm, summary, remedy, now_ns,
                  {"gpu": gpu, "gpu_node": str(node), "remote_node": str(biggest.node),
                   "remote_share": f"{remote / total:.2f}"}, cpus_allowed=process.cpus_allowed)


def node_filler(placement: PagePlacement, process: ProcessInfo | None, topo: Topology,
                gpu_users: dict[int, list[str]], t: Thresholds, now_ns: int) -> Alert | None:
    """Another process (a backup, log archiving) fills the page cache of a
    node whose GPUs serve inference. ``gpu_users``: GPU address -> comms of
    the inference processes using it."""
    if process and process.gpus:
        return None  # inference processes are judged by remote_memory
    rate = placement.page_cache_pages * PAGE / max(placement.interval_ns / 1e9, 1e-9)
    if rate < t.filler_bytes_per_s:
        return None
    gpus = [g for g in gpu_users if gpu_node(topo, g) == placement.node]
    if not gpus:
        return None
    others = [n.node for n in topo.numa_nodes if n.node != placement.node and
              not any(gpu_node(topo, g) == n.node for g in gpu_users)]
    target = others[0] if others else next((n.node for n in topo.numa_nodes if n.node != placement.node), None)
    users = sorted({c for g in gpus for c in gpu_users[g]})
    summary = (f"{placement.comm} (pid {placement.pid}) fills node {placement.node}'s page cache at "
               f"{rate / MB:.0f} MiB/s, the node of GPU(s) {', '.join(gpus)} serving {', '.join(users)}")
    if target is not None:
        remedy = (f"run {placement.comm} on node {target}: numactl --cpunodebind={target} --membind={target} "
                  f"<command> (now: migratepages {placement.pid} {placement.node} {target}); or make it use "
                  "direct I/O / posix_fadvise(DONTNEED)")
    else:
        remedy = f"make {placement.comm} use direct I/O or posix_fadvise(DONTNEED), or run it off-peak"
    return _alert(placement, "numa_node_filler", "warning", placement.pid, placement.comm, summary, remedy,
                  now_ns, {"node": str(placement.node), "gpus": ",".join(gpus), "mib_per_s": f"{rate / MB:.0f}",
                           "move_to_node": "" if target is None else str(target)})


def migration_storm(m: Migrations, process: ProcessInfo | None, topo: Topology | None,
                    t: Thresholds, now_ns: int) -> Alert | None:
    rate = m.migrations / max(m.interval_ns / 1e9, 1e-9)
    if rate < t.migrations_per_s:
        return None
    gpu, node, node_cpus = _gpu_context(topo, process.gpus) if topo and process else ("", -1, [])
    pin = node_cpus or (process.cpus_allowed if process else [])
    summary = (f"thread {m.tid} of {m.comm} (pid {m.pid}) moved between CPUs {rate:.0f} times/s"
               + (f", {m.cross_node} times to another NUMA node" if m.cross_node else ""))
    remedy = (f"pin it: taskset -pc {cpu_list(pin)} {m.tid}" + (f" (the CPUs of GPU {gpu}'s node {node})" if gpu else "")
              if pin else f"pin it to a few CPUs with taskset -pc <cpus> {m.tid}")
    return _alert(m, "migration_storm", "warning", m.pid, m.comm, summary, remedy, now_ns,
                  {"per_s": f"{rate:.0f}", "cross_node": str(m.cross_node), "gpu": gpu}, tid=m.tid)


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
            return _alert(call, "pcie_contention", "critical", call.pid, call.comm, summary, remedy, now_ns,
                          {"gpu": gpu, "switch": switch, "neighbour": name, "neighbour_pci": neighbour.address,
                           "mib_per_s": f"{rate / MB:.0f}", "latency_ms": f"{call.latency_ns / 1e6:.1f}"},
                          tid=call.tid, duration_ns=call.latency_ns)
    return None
