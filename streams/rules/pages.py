# SPDX-License-Identifier: Apache-2.0
"""Page-placement rules (signal: the pages probe, topic jitterscope.pages):
an inference process's memory lands away from its GPU's node, or another
job fills the page cache of a GPU's node. Pure: no I/O."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, PagePlacement, ProcessInfo, Topology
from jitterscope.schemas.topology import gpu_node
from jitterscope.streams.rules.base import MB, PAGE, Thresholds, alert, gpu_context


def _pages(p: PagePlacement) -> int:
    return p.page_cache_pages + p.alloc_pages


def _cache_rate(p: PagePlacement) -> float:
    """Bytes per second the process added to the node's page cache."""
    return p.page_cache_pages * PAGE / max(p.interval_ns / 1e9, 1e-9)


def remote_memory(process: ProcessInfo, placements: list[PagePlacement], topo: Topology,
                  t: Thresholds, now_ns: int, fillers: dict[int, PagePlacement] | None = None) -> Alert | None:
    """An inference process's new pages land mostly away from its GPU's node.
    ``placements``: its records of one interval, one per node. ``fillers``:
    node -> the biggest page-cache filler of the same interval among the
    processes that serve no GPU: where one fills the GPU's node, that is
    why the pages went remote (the node was full), and the alert names it."""
    gpu, node, _ = gpu_context(topo, process.gpus)
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
    filler = (fillers or {}).get(node)
    if filler is not None and _cache_rate(filler) < t.filler_bytes_per_s:
        filler = None  # the node's cache grows, but not enough to have pushed the pages away
    if filler is not None:
        summary += (f"; node {node} is being filled by {filler.comm} (pid {filler.pid}), "
                    f"{_cache_rate(filler) / MB:.0f} MiB/s of page cache")
        remedy = (f"move {filler.comm} off node {node} (numactl --membind={biggest.node}, now: migratepages "
                  f"{filler.pid} {node} {biggest.node}) or make it use direct I/O / posix_fadvise(DONTNEED); "
                  f"then {remedy}")
    return alert(biggest, "numa_remote_memory", "warning", process.pid, process.comm, summary, remedy, now_ns,
                 {"gpu": gpu, "gpu_node": str(node), "remote_node": str(biggest.node),
                  "remote_share": f"{remote / total:.2f}",
                  "filled_by": f"{filler.comm} (pid {filler.pid})" if filler else ""},
                 cpus_allowed=process.cpus_allowed)


def node_filler(placement: PagePlacement, process: ProcessInfo | None, topo: Topology,
                gpu_users: dict[str, list[str]], t: Thresholds, now_ns: int) -> Alert | None:
    """Another process (a backup, log archiving) fills the page cache of a
    node whose GPUs serve inference. ``gpu_users``: GPU address -> comms of
    the inference processes using it."""
    if process and process.gpus:
        return None  # inference processes are judged by remote_memory
    rate = _cache_rate(placement)
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
    return alert(placement, "numa_node_filler", "warning", placement.pid, placement.comm, summary, remedy,
                 now_ns, {"node": str(placement.node), "gpus": ",".join(gpus), "mib_per_s": f"{rate / MB:.0f}",
                          "move_to_node": "" if target is None else str(target)})
