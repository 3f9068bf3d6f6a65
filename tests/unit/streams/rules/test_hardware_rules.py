# SPDX-License-Identifier: Apache-2.0
"""The hardware rules (streams/rules/gpu_ioctl.py, processes.py, pages.py,
migrate.py, blockio.py) and their handlers (streams/handlers.py) against the
fixture 2-socket, 8-GPU server: each alert fires on its evidence, stays quiet
without it, and its remedy names this topology's nodes, CPUs and devices."""

from __future__ import annotations

import asyncio

import pytest

from jitterscope.collector import topology as t
from jitterscope.schemas import topology as st
from jitterscope.schemas import events, topics
from jitterscope.common.settings import Settings
from jitterscope.streams.handlers import Handlers
from jitterscope.streams.rules import blockio, gpu_ioctl, migrate, pages, processes
from jitterscope.streams.rules.base import MB, Thresholds
from tests.fixtures.sysfs_builder import build_host

MS = 1_000_000
S = 1_000_000_000
NOW = 1_800_000_000 * S
GPU4 = "0000:83:00.0"  # node 1, switch 0000:81:00.0 with nvme0 and nvme1
GPU0 = "0000:03:00.0"  # node 0, switch 0000:01:00.0 with eth0 and eth1
NODE1_CPUS = "16-31,48-63"
T = Thresholds.defaults()


@pytest.fixture(scope="module")
def topo(tmp_path_factory):
    host = build_host(tmp_path_factory.mktemp("host"))
    return events.Topology(host="gpu-a1", boot_id="b", seq=0, ts_ns=NOW,
                           **t.read_topology(host.sys, host.proc, nvml=False))


def process(pid=4242, comm="vllm", gpus=(GPU4,), cpus=range(64)) -> events.ProcessInfo:
    return events.ProcessInfo(host="gpu-a1", boot_id="b", seq=1, ts_ns=NOW, pid=pid, comm=comm,
                              cmdline=f"{comm} serve", cgroup="/", cpus_allowed=list(cpus), gpus=list(gpus))


def ioctl(latency_ms=120.0, pid=4242) -> events.GpuIoctl:
    return events.GpuIoctl(host="gpu-a1", boot_id="b", seq=2, ts_ns=NOW, pid=pid, tid=pid + 1, comm="vllm",
                           fd=9, request=0xC020462A, latency_ns=int(latency_ms * MS), device="/dev/nvidia4")


def placement(pid, node, page_cache=0, alloc=0, comm="tar", seconds=10) -> events.PagePlacement:
    return events.PagePlacement(host="gpu-a1", boot_id="b", seq=3, ts_ns=NOW, pid=pid, comm=comm, node=node,
                                interval_ns=seconds * S, page_cache_pages=page_cache, alloc_pages=alloc)


def io(pci, mib_per_s, device="nvme0n1", seconds=10) -> events.DeviceIo:
    return events.DeviceIo(host="gpu-a1", boot_id="b", seq=4, ts_ns=NOW, device=device, kind="block", pci=pci,
                           interval_ns=seconds * S, ios=1000, bytes=int(mib_per_s * seconds * MB))


def test_gpu_ioctl_stall_fires_over_the_threshold_only(topo):
    alert = gpu_ioctl.gpu_ioctl_stall(ioctl(120), process(), topo, T, NOW)
    assert alert.kind == "gpu_ioctl_stall" and alert.severity == "warning"
    assert "120 ms" in alert.summary and GPU4 in alert.summary and "node 1" in alert.summary
    assert alert.evidence["gpu"] == GPU4 and alert.wait_ns == 120 * MS
    assert gpu_ioctl.gpu_ioctl_stall(ioctl(20), process(), topo, T, NOW) is None


def test_cpu_off_the_gpu_node_names_the_node_and_its_cpus(topo):
    alert = processes.cpu_off_gpu_node(process(cpus=range(64)), topo, NOW)
    assert alert.kind == "numa_cpu_mismatch"
    assert alert.remedy.startswith("numactl --cpunodebind=1 --membind=1")
    assert f"taskset -apc {NODE1_CPUS} 4242" in alert.remedy
    assert alert.evidence["remote_cpus"] == "0-15,32-47"
    assert processes.cpu_off_gpu_node(process(cpus=[*range(16, 32), *range(48, 64)]), topo, NOW) is None
    assert processes.cpu_off_gpu_node(process(gpus=()), topo, NOW) is None


def test_inference_memory_on_the_remote_node(topo):
    remote = [placement(4242, 0, page_cache=60_000, comm="vllm"), placement(4242, 1, alloc=10_000, comm="vllm")]
    alert = pages.remote_memory(process(), remote, topo, T, NOW)
    assert alert.kind == "numa_remote_memory" and "node 0" in alert.summary
    assert "migratepages 4242 0 1" in alert.remedy and "--membind=1" in alert.remedy
    local = [placement(4242, 1, page_cache=60_000, comm="vllm"), placement(4242, 0, alloc=1_000, comm="vllm")]
    assert pages.remote_memory(process(), local, topo, T, NOW) is None
    assert pages.remote_memory(process(), [placement(4242, 0, alloc=100)], topo, T, NOW) is None  # too little


def test_remote_memory_names_who_filled_the_gpu_s_node(topo):
    # the remote-allocation variant of the archiver story: node 1 (the GPU's) fills with a backup's
    # page cache, so the server's new pages land on node 0; the alert says so and moves the backup first
    remote = [placement(4242, 0, page_cache=60_000, comm="vllm"), placement(4242, 1, alloc=10_000, comm="vllm")]
    fillers = {1: placement(777, 1, page_cache=200_000, comm="backup"), 0: placement(778, 0, page_cache=900_000)}
    alert = pages.remote_memory(process(), remote, topo, T, NOW, fillers)
    assert "node 1 is being filled by backup (pid 777), 78 MiB/s" in alert.summary
    assert alert.remedy.startswith("move backup off node 1 (numactl --membind=0, now: migratepages 777 1 0)")
    assert "migratepages 4242 0 1" in alert.remedy and alert.evidence["filled_by"] == "backup (pid 777)"
    slow = {1: placement(777, 1, page_cache=1_000, comm="backup")}  # not enough to have pushed anything away
    alert = pages.remote_memory(process(), remote, topo, T, NOW, slow)
    assert "filled" not in alert.summary and alert.evidence["filled_by"] == ""


def test_another_job_filling_the_gpu_node_is_sent_to_the_other_node(topo):
    users = {GPU4: ["vllm"]}  # node 1 serves inference, node 0 does not
    backup = placement(777, 1, page_cache=200_000, comm="backup")  # 78 MiB/s over 10 s
    alert = pages.node_filler(backup, None, topo, users, T, NOW)
    assert alert.kind == "numa_node_filler" and "backup (pid 777)" in alert.summary and "vllm" in alert.summary
    assert alert.remedy.startswith("run backup on node 0: numactl --cpunodebind=0 --membind=0")
    assert "migratepages 777 1 0" in alert.remedy
    assert pages.node_filler(placement(777, 0, page_cache=200_000), None, topo, users, T, NOW) is None  # no GPU user there
    assert pages.node_filler(placement(777, 1, page_cache=1_000), None, topo, users, T, NOW) is None  # slow


def test_migration_storm_pins_to_the_gpu_node(topo):
    storm = events.Migrations(host="gpu-a1", boot_id="b", seq=5, ts_ns=NOW, pid=4242, tid=4250, comm="vllm",
                              interval_ns=10 * S, migrations=1200, cross_node=300, last_cpu=3)
    alert = migrate.migration_storm(storm, process(), topo, T, NOW)
    assert alert.kind == "migration_storm" and alert.tid == 4250 and "120 times/s" in alert.summary
    assert f"taskset -pc {NODE1_CPUS} 4250" in alert.remedy
    calm = events.Migrations(**{**{f: getattr(storm, f) for f in storm.__struct_fields__}, "migrations": 30})
    assert migrate.migration_storm(calm, process(), topo, T, NOW) is None


def test_a_zero_or_tiny_interval_is_no_storm(topo):
    """The stop flush once sent interval 0: 8 migrations read as 8e9 per
    second, and every Ctrl-C stored a burst of bogus storms."""
    for interval_ns in (0, 1_000, migrate.MIN_RATE_INTERVAL_NS - 1):
        flush = events.Migrations(host="gpu-a1", boot_id="b", seq=6, ts_ns=NOW, pid=12, tid=12, comm="kworker/0:1",
                                  interval_ns=interval_ns, migrations=8, cross_node=0, last_cpu=1)
        assert migrate.migration_storm(flush, process(), topo, T, NOW) is None


def test_pcie_contention_needs_traffic_on_the_same_switch(topo):
    nvme0 = next(d for d in topo.pci if d.name == "nvme0").address
    eth0 = next(d for d in topo.pci if d.name == "eth0").address
    alert = blockio.pcie_contention(ioctl(120), process(), topo, {nvme0: io(nvme0, 900)}, T, NOW)
    assert alert.kind == "pcie_contention" and alert.evidence["switch"] == st.shared_switch(topo, GPU4, nvme0)
    assert "nvme0" in alert.summary and "900 MiB/s" in alert.summary
    # traffic on a device under another switch, or too little, or no stall: quiet
    assert blockio.pcie_contention(ioctl(120), process(), topo, {eth0: io(eth0, 900, "eth0")}, T, NOW) is None
    assert blockio.pcie_contention(ioctl(120), process(), topo, {nvme0: io(nvme0, 20)}, T, NOW) is None
    assert blockio.pcie_contention(ioctl(10), process(), topo, {nvme0: io(nvme0, 900)}, T, NOW) is None


def handle(handlers, topic, records, now_ns):
    return asyncio.run(handlers.handle(topic, records, now_ns))


class State:
    """The slice of the worker's HostState the judge reads."""

    def __init__(self, topo, processes, traffic=()):
        self.topology = {"gpu-a1": topo}
        self.processes = {("gpu-a1", p.pid): p for p in processes}
        self._traffic = {io.pci: io for io in traffic}

    def host_traffic(self, host):
        return self._traffic

    def gpu_users(self, host):
        users = {}
        for p in self.processes.values():
            for g in p.gpus:
                users.setdefault(g, []).append(p.comm)
        return users


def test_judge_prefers_contention_and_quiets_repeats(topo):
    nvme0 = next(d for d in topo.pci if d.name == "nvme0").address
    judge = Handlers(State(topo, [process()], [io(nvme0, 900)]))
    [alert] = handle(judge, topics.GPU_IOCTL, [ioctl(120)], NOW)
    assert alert.kind == "pcie_contention"
    first = handle(judge, topics.PROCESSES, [process()], NOW)
    again = handle(judge, topics.PROCESSES, [process()], NOW + 60 * S)
    later = handle(judge, topics.PROCESSES, [process()], NOW + 700 * S)
    assert [a.kind for a in first] == ["numa_cpu_mismatch"] and again == [] and len(later) == 1


def test_judge_groups_page_placement_per_process(topo):
    judge = Handlers(State(topo, [process()]))
    alerts = handle(judge, topics.PAGES, [placement(4242, 0, page_cache=60_000, comm="vllm"),
                                        placement(4242, 1, alloc=10_000, comm="vllm"),
                                        placement(777, 1, page_cache=200_000, comm="backup")], NOW)
    assert sorted(a.kind for a in alerts) == ["numa_node_filler", "numa_remote_memory"]
    [remote] = [a for a in alerts if a.kind == "numa_remote_memory"]
    assert remote.evidence["filled_by"] == "backup (pid 777)"  # not vllm itself, though it added more on node 0


def test_thresholds_come_from_the_settings():
    """One source per value: the defaults are the settings' defaults, and
    every threshold follows its setting."""
    assert T == Thresholds(runq_alert_ns=10 * MS, loss_alert_events=1000, gpu_ioctl_ns=50 * MS,
                           migrations_per_s=50.0, remote_share=0.5, remote_min_pages=25_600,
                           filler_bytes_per_s=50 * MB, neighbour_bytes_per_s=200 * MB, irq_share=0.2,
                           cfs_throttle_ns=10 * MS)
    t = Thresholds.from_settings(Settings.model_construct(
        runq_alert_ms=2.5, loss_alert_events=7, gpu_ioctl_alert_ms=20.0, migration_storm_per_s=5.0,
        numa_remote_share=0.25, numa_remote_min_mb=1.0, numa_filler_mb_per_s=10.0, pcie_neighbour_mb_per_s=30.0,
        irq_alert_share=0.3, cfs_throttle_alert_ms=4.0))
    assert t == Thresholds(runq_alert_ns=2_500_000, loss_alert_events=7, gpu_ioctl_ns=20 * MS, migrations_per_s=5.0,
                           remote_share=0.25, remote_min_pages=256, filler_bytes_per_s=10 * MB,
                           neighbour_bytes_per_s=30 * MB, irq_share=0.3, cfs_throttle_ns=4 * MS)


def test_the_table_routes_each_topic_to_its_signal_only(topo):
    judge = Handlers(State(topo, [process()]))
    assert set(judge.table) == {topics.RUNQ, topics.REQUESTS, topics.COLLECTOR_STATS, topics.GPU_IOCTL,
                                topics.PROCESSES, topics.MIGRATIONS, topics.PAGES,
                                topics.IRQ, topics.CGROUP_THROTTLE, topics.GPU_XID, topics.GPU_TELEMETRY,
                                topics.HISTOGRAMS,  # no rule: feeds /metrics (streams/signal_metrics.py)
                                topics.BLOCKED}  # no rule: evidence for request attribution
    assert set(judge.table) <= set(topics.INPUT_TOPICS)
    assert handle(judge, topics.TOPOLOGY, [topo], NOW) == []  # state only, no rule
