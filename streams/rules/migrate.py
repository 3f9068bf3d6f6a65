# SPDX-License-Identifier: Apache-2.0
"""CPU-migration rule (signal: the migrate probe, topic
jitterscope.migrations): a thread hops between CPUs often enough to lose its
caches. Pure: no I/O."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, Migrations, ProcessInfo, Topology
from jitterscope.schemas.topology import cpu_list
from jitterscope.streams.rules.base import Thresholds, alert, gpu_context


#: a rate over a shorter interval says nothing: one migration in the last
#: 10 us of a stop is not "100,000 per second" (collectors before the stop fix
#: sent interval 0 on their last flush, which read as 8e9 per second)
MIN_RATE_INTERVAL_NS = 100_000_000


def migration_storm(m: Migrations, process: ProcessInfo | None, topo: Topology | None,
                    t: Thresholds, now_ns: int) -> Alert | None:
    if m.interval_ns < MIN_RATE_INTERVAL_NS:
        return None
    rate = m.migrations / (m.interval_ns / 1e9)
    if rate < t.migrations_per_s:
        return None
    gpu, node, node_cpus = gpu_context(topo, process.gpus) if topo and process else ("", -1, [])
    pin = node_cpus or (process.cpus_allowed if process else [])
    summary = (f"thread {m.tid} of {m.comm} (pid {m.pid}) moved between CPUs {rate:.0f} times/s"
               + (f", {m.cross_node} times to another NUMA node" if m.cross_node else ""))
    why = f" (the CPUs of GPU {gpu}'s node {node})" if gpu else ""
    remedy = (f"pin it: taskset -pc {cpu_list(pin)} {m.tid}{why}"
              if pin else f"pin it to a few CPUs with taskset -pc <cpus> {m.tid}")
    return alert(m, "migration_storm", "warning", m.pid, m.comm, summary, remedy, now_ns,
                 {"per_s": f"{rate:.0f}", "cross_node": str(m.cross_node), "gpu": gpu}, tid=m.tid)
