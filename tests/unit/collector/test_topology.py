# SPDX-License-Identifier: Apache-2.0
"""collector/topology.py (and the pure questions in schemas/topology.py) against a built 2-socket, 8-GPU sysfs/procfs
(tests/fixtures/sysfs_builder.py) and against this machine's own /sys and /proc."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from jitterscope.collector import topology as t
from jitterscope.schemas import topology as st
from jitterscope.collector.hostinfo import online_cpus
from jitterscope.schemas.events import Topology
from tests.fixtures.sysfs_builder import TWO_SOCKET_8GPU, HostSpec, Node, build_host, replace_endpoint

NODE0 = list(range(16)) + list(range(32, 48))
NODE1 = list(range(16, 32)) + list(range(48, 64))
GPU_NODE = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
# gpuN -> (its address, the bridges above it: root port, switch upstream port, downstream port)
GPUS = {
    0: ("0000:03:00.0", ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]),
    1: ("0000:04:00.0", ["0000:00:01.0", "0000:01:00.0", "0000:02:10.0"]),
    2: ("0000:09:00.0", ["0000:00:02.0", "0000:07:00.0", "0000:08:08.0"]),
    3: ("0000:0a:00.0", ["0000:00:02.0", "0000:07:00.0", "0000:08:10.0"]),
    4: ("0000:83:00.0", ["0000:80:01.0", "0000:81:00.0", "0000:82:08.0"]),
    5: ("0000:84:00.0", ["0000:80:01.0", "0000:81:00.0", "0000:82:10.0"]),
    6: ("0000:89:00.0", ["0000:80:02.0", "0000:87:00.0", "0000:88:08.0"]),
    7: ("0000:8a:00.0", ["0000:80:02.0", "0000:87:00.0", "0000:88:10.0"]),
}


def record(fields: dict) -> Topology:
    return Topology(host="h", boot_id="b", seq=0, ts_ns=0, **fields)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host(tmp_path_factory.mktemp("host"))


@pytest.fixture(scope="module")
def fields(host):
    return t.read_topology(host.sys, host.proc, nvml=False)


@pytest.fixture(scope="module")
def topo(fields):
    return record(fields)


def by_kind(topo, kind):
    return {d.address: d for d in topo.pci if d.kind == kind}


# --- NUMA nodes and CPUs ------------------------------------------------------------


def test_nodes_and_their_cpus(topo):
    assert topo.cpus == list(range(64))
    assert [n.node for n in topo.numa_nodes] == [0, 1]
    assert st.cpus_of_node(topo, 0) == NODE0
    assert st.cpus_of_node(topo, 1) == NODE1
    assert st.cpus_of_node(topo, 7) == []


def test_node_memory_comes_from_node_meminfo(topo):
    assert [n.memory_bytes for n in topo.numa_nodes] == [263_508_000 * 1024, 264_182_000 * 1024]


def test_pfn_ranges_merge_adjacent_zones_and_skip_empty_ones(topo):
    # node 0: DMA [1,4096) + DMA32 [4096,1M) + Normal [1M,64M) are one range
    assert topo.numa_nodes[0].pfn_ranges == [[1, 67108864]]
    assert topo.numa_nodes[1].pfn_ranges == [[67108864, 134217728]]


@pytest.mark.parametrize("pfn, node", [
    (0, -1), (1, 0), (4096, 0), (67108863, 0), (67108864, 1), (134217727, 1), (134217728, -1)])
def test_node_of_pfn(topo, pfn, node):
    assert st.node_of_pfn(topo, pfn) == node


def test_cpu_info_siblings_sockets_and_nodes(topo):
    info = {c.cpu: c for c in topo.cpu_info}
    assert sorted(info) == list(range(64))
    assert info[0].siblings == [0, 32] and info[32].siblings == [0, 32]
    assert info[17].siblings == [17, 49]
    assert (info[5].socket, info[5].core, info[5].node) == (0, 5, 0)
    assert (info[53].socket, info[53].core, info[53].node) == (1, 5, 1)
    assert all(st.node_of_cpu(topo, c) == 0 for c in NODE0)
    assert all(st.node_of_cpu(topo, c) == 1 for c in NODE1)
    assert st.node_of_cpu(topo, 99) == -1


def test_node_of_cpu_without_cpu_info_uses_node_cpulists(fields):
    assert st.node_of_cpu(record({**fields, "cpu_info": []}), 48) == 1


def test_without_numa_sysfs_one_node_holds_every_cpu_and_all_memory(tmp_path):
    spec = HostSpec([Node(0, [(0,), (1,), (2,), (3,)], 8_000_000, [("DMA32", 4096, 1044480)])],
                    [], numa_sysfs=False)
    host = build_host(tmp_path, spec)
    assert not (host.sys / "devices/system/node").exists()
    nodes = t.read_topology(host.sys, host.proc, nvml=False)["numa_nodes"]
    assert [(n.node, n.cpus, n.memory_bytes) for n in nodes] == [(0, [0, 1, 2, 3], 8_000_000 * 1024)]
    assert nodes[0].pfn_ranges == [[4096, 1048576]]


@pytest.mark.parametrize("cpus, text", [
    ([], ""), ([3], "3"), ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"), ([5, 4, 4, 6], "4-6"),
    (NODE1, "16-31,48-63")])
def test_cpu_list(cpus, text):
    assert st.cpu_list(cpus) == text


# --- PCI ------------------------------------------------------------------------------


def test_all_eight_gpus_with_node_chain_and_name(topo):
    gpus = by_kind(topo, "gpu")
    assert sorted(gpus) == sorted(address for address, _ in GPUS.values())
    for minor, (address, upstream) in GPUS.items():
        gpu = gpus[address]
        assert (gpu.vendor, gpu.class_code) == (0x10DE, 0x030200)
        assert gpu.numa_node == GPU_NODE[minor] == st.gpu_node(topo, address)
        assert gpu.upstream == upstream
        assert gpu.name == f"nvidia{minor}"  # from /proc/driver/nvidia, NVML being off
        assert (gpu.link_gen, gpu.link_width) == (4, 16)
        assert st.gpu_by_address(topo, address) == gpu


def test_nvme_and_nics_are_named_and_other_devices_left_out(topo):
    nvme = by_kind(topo, "nvme")
    assert {a: (d.name, d.numa_node, d.link_width) for a, d in nvme.items()} == {
        "0000:85:00.0": ("nvme0", 1, 4), "0000:86:00.0": ("nvme1", 1, 4)}
    nics = by_kind(topo, "nic")
    assert {a: (d.name, d.numa_node) for a, d in nics.items()} == {
        "0000:05:00.0": ("eth0", 0), "0000:06:00.0": ("eth1", 0)}
    # bridges, the host bridge, SATA and the BMC's (non-NVIDIA) VGA are not listed
    assert len(topo.pci) == 12
    assert "0000:02:08.0" not in {d.address for d in topo.pci}
    assert st.gpu_by_address(topo, "0000:00:1c.0") is None
    assert st.gpu_by_address(topo, "0000:85:00.0") is None  # an NVMe, not a GPU


def test_gpu_by_address_takes_nvml_spelling(topo):
    assert st.gpu_by_address(topo, "00000000:8A:00.0").address == "0000:8a:00.0"


def test_shared_switch(topo):
    gpu4, gpu5, gpu6 = GPUS[4][0], GPUS[5][0], GPUS[6][0]
    assert st.shared_switch(topo, gpu4, "0000:85:00.0") == "0000:81:00.0"  # gpu4 and nvme0
    assert st.shared_switch(topo, gpu4, gpu5) == "0000:81:00.0"
    assert st.shared_switch(topo, gpu4, gpu6) is None  # same root complex, different switches
    assert st.shared_switch(topo, gpu4, GPUS[0][0]) is None  # different sockets
    assert st.shared_switch(topo, gpu4, "0000:ff:00.0") is None  # unknown device


def test_neighbours_of_gpu(topo):
    names = lambda gpu: [d.name for d in st.neighbours_of_gpu(topo, GPUS[gpu][0])]
    assert names(4) == names(5) == ["nvme0", "nvme1"]
    assert names(0) == names(1) == ["eth0", "eth1"]
    assert names(2) == names(3) == names(6) == names(7) == []


def test_gpu_node_falls_back_to_devices_under_the_same_host_bridge(tmp_path):
    spec = replace_endpoint(TWO_SOCKET_8GPU, "gpu6", numa_node=-1)
    topo = record(t.read_topology(*_roots(build_host(tmp_path / "a", spec)), nvml=False))
    gpu6 = GPUS[6][0]
    assert st.gpu_by_address(topo, gpu6).numa_node == -1
    assert st.gpu_node(topo, gpu6) == 1  # its neighbours on pci0000:80 say node 1

    spec = dataclasses.replace(spec, root_complexes=[
        dataclasses.replace(rc, node=-1) for rc in TWO_SOCKET_8GPU.root_complexes])
    topo = record(t.read_topology(*_roots(build_host(tmp_path / "b", spec)), nvml=False))
    assert st.gpu_node(topo, gpu6) == -1  # nothing says
    assert st.gpu_node(topo, "0000:ff:00.0") == -1


def test_virtio_nic_names_its_interface_one_level_down(tmp_path):
    spec = replace_endpoint(TWO_SOCKET_8GPU, "eth1", net="ens5", net_parent="virtio2")
    topo = record(t.read_topology(*_roots(build_host(tmp_path, spec)), nvml=False))
    assert by_kind(topo, "nic")["0000:06:00.0"].name == "ens5"


def test_sr_iov_virtual_functions_are_left_out(tmp_path):
    built = build_host(tmp_path)
    vf = (built.sys / "bus/pci/devices/0000:06:00.0").resolve()
    (vf / "physfn").symlink_to("../../0000:02:18.0/0000:05:00.0")  # the PF
    topo = record(t.read_topology(*_roots(built), nvml=False))
    assert sorted(by_kind(topo, "nic")) == ["0000:05:00.0"]


@pytest.mark.parametrize("speed, gen", [
    ("2.5 GT/s PCIe", 1), ("5.0 GT/s PCIe", 2), ("8.0 GT/s PCIe", 3), ("8 GT/s", 3),
    ("16.0 GT/s PCIe", 4), ("32.0 GT/s PCIe", 5), ("64.0 GT/s PCIe", 6),
    ("Unknown", 0), ("", 0)])
def test_link_gen(speed, gen):
    assert t.link_gen(speed) == gen


def test_nvml_names_gpus_by_index_and_gives_link_state(host):
    fake = FakeNvml({"00000000:03:00.0": (3, 16), "00000000:0A:00.0": (1, 8)})
    topo = record(t.read_topology(host.sys, host.proc, nvml=fake))
    gpus = by_kind(topo, "gpu")
    assert (gpus["0000:03:00.0"].name, gpus["0000:03:00.0"].link_gen, gpus["0000:03:00.0"].link_width) == ("0", 3, 16)
    assert (gpus["0000:0a:00.0"].name, gpus["0000:0a:00.0"].link_gen, gpus["0000:0a:00.0"].link_width) == ("1", 1, 8)
    assert gpus["0000:04:00.0"].name == "nvidia1"  # NVML did not list it: procfs names it
    assert fake.shut_down


def test_nvml_that_fails_to_initialise_is_ignored(host):
    fake = FakeNvml({}, init_fails=True)
    assert by_kind(record(t.read_topology(host.sys, host.proc, nvml=fake)), "gpu")["0000:03:00.0"].name == "nvidia0"


# --- processes -----------------------------------------------------------------------


def test_process_gpus(host, topo):
    assert t.process_gpus(4242, host.proc, topo) == (["0000:0a:00.0"], "3")
    assert t.process_gpus(4242, host.proc) == (["0000:0a:00.0"], "3")  # procfs alone is enough


def test_process_gpus_of_a_missing_process(host, topo):
    assert t.process_gpus(99999, host.proc, topo) == ([], "")


def test_process_gpus_without_driver_procfs_uses_nvml_index(tmp_path):
    # procfs of a container that hides /proc/driver/nvidia: GPU names from NVML
    built = build_host(tmp_path)
    topo = record(t.read_topology(built.sys, built.proc,
                                  nvml=FakeNvml({a: (4, 16) for a, _ in GPUS.values()})))
    for info in (built.proc / "driver/nvidia/gpus").glob("*/information"):
        info.unlink()
    assert t.process_gpus(4242, built.proc, topo) == (["0000:0a:00.0"], "3")
    assert t.process_gpus(4242, built.proc) == ([], "3")  # nothing maps the minor


def test_unreadable_process_gives_nothing(tmp_path):
    built = build_host(tmp_path)
    (built.proc / "4242/environ").unlink()  # as when /proc/<pid>/environ is EACCES
    assert t.process_gpus(4242, built.proc) == ([], "")


# --- this machine -------------------------------------------------------------------


def test_this_machine():
    fields = t.read_topology()  # real /sys and /proc, NVML if installed
    topo = record(fields)
    assert topo.cpus == online_cpus() and len(topo.cpus) == os.cpu_count()
    assert [c.cpu for c in topo.cpu_info] == topo.cpus
    assert all(st.node_of_cpu(topo, c) >= 0 for c in topo.cpus)
    assert topo.numa_nodes and sum(len(n.cpus) for n in topo.numa_nodes) == len(topo.cpus)
    assert all(n.memory_bytes > 0 for n in topo.numa_nodes if n.cpus)
    node0 = topo.numa_nodes[0]
    assert node0.node == 0 and node0.pfn_ranges
    start, end = node0.pfn_ranges[0]
    assert st.node_of_pfn(topo, (start + end) // 2) == 0
    # The build machines have no GPU; a host that has one must list exactly
    # the NVIDIA display controllers sysfs shows.
    nvidia = sorted(p.name for p in Path("/sys/bus/pci/devices").glob("*")
                    if (p / "vendor").read_text().strip() == "0x10de"
                    and (p / "class").read_text().startswith("0x03")
                    and not (p / "physfn").is_symlink())
    assert sorted(by_kind(topo, "gpu")) == nvidia
    assert all(d.kind in ("gpu", "nvme", "nic") for d in topo.pci)


# --- helpers -------------------------------------------------------------------------


def _roots(host):
    return host.sys, host.proc


class FakeNvml:
    """The slice of pynvml that topology.py calls."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: dict[str, tuple[int, int]], init_fails: bool = False):
        self.gpus = list(gpus.items())  # busId -> (gen, width), in NVML index order
        self.init_fails = init_fails
        self.shut_down = False

    def nvmlInit(self):
        if self.init_fails:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=self.gpus[handle][0].encode())  # bytes, as older pynvml returns

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self.gpus[handle][1][0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self.gpus[handle][1][1]
