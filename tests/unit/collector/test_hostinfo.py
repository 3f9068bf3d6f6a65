# SPDX-License-Identifier: Apache-2.0
"""collector/hostinfo.py against captured /proc and /sys trees (tests/fixtures)."""

import os
from pathlib import Path

import pytest

from jitterscope.collector import hostinfo
from jitterscope.collector.hostinfo import ProcessGone
from jitterscope.schemas.topology import parse_cpu_list

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROC = FIXTURES / "host-2node" / "proc"
SYS = FIXTURES / "host-2node" / "sys"
SYS_NONUMA = FIXTURES / "host-nonuma" / "sys"


@pytest.mark.parametrize("text, cpus", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
    ("0", [0]),
    ("7\n", [7]),
    ("", []),
    ("\n", []),
    ("\t0-1", [0, 1]),  # as it follows "Cpus_allowed_list:" in /proc/<pid>/status
])
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


def test_process_info_of_a_cgroup_v2_process():
    info = hostinfo.process_info(1234, PROC)
    assert info == {
        "pid": 1234,
        "comm": "python3",
        "cmdline": "python3 -m vllm.entrypoints.openai.api_server --model /models/llama-3-8b",
        "cgroup": "/system.slice/vllm.service",
        "memory_cgroup": "/system.slice/vllm.service",  # v2: one cgroup for every controller
        "cpus_allowed": [0, 1, 2, 3],
        "ppid": 1,
        "ns_pid": 1234,  # on the host: its own pid
        "container_id": "",
        "pod_uid": "",
        "pod": "",
        "namespace": "",
        "container": "",
    }


def test_process_info_keeps_hostile_names_verbatim():
    info = hostinfo.process_info(4321, PROC)
    assert info["comm"] == "<script>[bold]"
    assert info["cmdline"] == "./<script>[bold] --rich=[red]x[/red]"
    assert info["cpus_allowed"] == [4, 5, 6, 7]


def test_process_info_cgroup_v1_names_the_cpu_controllers_cgroup():
    # the one whose CFS quota throttles it (CgroupThrottle names cgroups the same way)
    assert hostinfo.process_info(4321, PROC)["cgroup"] == "/"


def test_process_info_without_a_v1_cpu_line_takes_the_v2_line():
    assert hostinfo.process_info(2, PROC)["cgroup"] == "/"


def test_process_info_kernel_thread_has_empty_cmdline():
    info = hostinfo.process_info(2, PROC)
    assert info["comm"] == "kthreadd"
    assert info["cmdline"] == ""
    assert info["cpus_allowed"] == list(range(8))


def test_process_info_of_a_thread_names_its_process():
    info = hostinfo.process_info(1240, PROC)
    assert info["pid"] == 1234
    assert info["comm"] == "cuda-EvtHandlr"


def test_process_info_of_a_missing_pid_raises_process_gone():
    with pytest.raises(ProcessGone, match="99999"):
        hostinfo.process_info(99999, PROC)


def test_tgid_of():
    assert hostinfo.tgid_of(1240, PROC) == 1234
    assert hostinfo.tgid_of(1234, PROC) == 1234
    assert hostinfo.tgid_of(99999, PROC) is None


def test_pids_matching():
    assert hostinfo.pids_matching(["python*"], PROC) == {1234}
    assert hostinfo.pids_matching(["kthreadd", "nope"], PROC) == {2}
    assert hostinfo.pids_matching(["<script>*"], PROC) == {4321}
    assert hostinfo.pids_matching(["Python*"], PROC) == set()  # case-sensitive
    assert hostinfo.pids_matching([], PROC) == set()


def test_pids_matching_skips_non_pid_entries():
    # proc/sys and proc/cpuinfo exist; "*" must only find numeric directories
    assert hostinfo.pids_matching(["*"], PROC) == {2, 1234, 1240, 4321}


def test_online_cpus():
    assert hostinfo.online_cpus(SYS) == list(range(8))


def test_numa_nodes_of_a_two_socket_host():
    # node/ also holds online, possible, has_cpu...; only nodeN directories count
    assert hostinfo.numa_nodes(SYS) == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}


def test_no_numa_falls_back_to_one_node_with_all_online_cpus():
    assert not (SYS_NONUMA / "devices/system/node").exists()
    assert hostinfo.numa_nodes(SYS_NONUMA) == {0: [0, 1, 2, 3]}


def test_boot_id():
    assert hostinfo.boot_id(PROC) == "3f0e6c2a-9b1d-4f7e-8a53-2d1c0b9e7f11"


# -- containers (tests/fixtures/host-containers) -------------------------------

CPROC = FIXTURES / "host-containers" / "proc"
DOCKER_ID = "3f4b8c2e1d0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"
TRITON_ID = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"
SGLANG_ID = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"
POD1 = "7d1e2c3b-4a5f-4e6d-9c8b-1a2b3c4d5e6f"
POD2 = "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e"


def test_process_info_makes_a_valid_process_info_record():
    """The collector builds the record as ProcessInfo(**stamp, **process_info(...)):
    every key must be a field, of the field's type."""
    import msgspec
    from jitterscope.schemas.events import ProcessInfo
    for proc, pid in ((PROC, 1234), (PROC, 4321), (PROC, 2), (CPROC, 2002), (CPROC, 4001)):
        info = hostinfo.process_info(pid, proc)
        assert set(info) <= set(ProcessInfo.__struct_fields__)
        record = ProcessInfo(host="h", boot_id="b", seq=1, ts_ns=1, **info)
        assert msgspec.json.decode(msgspec.json.encode(record), type=ProcessInfo) == record


def test_process_info_in_a_docker_container():
    info = hostinfo.process_info(2002, CPROC)
    assert (info["pid"], info["ppid"], info["ns_pid"]) == (2002, 2001, 7)
    assert info["container_id"] == DOCKER_ID and info["pod_uid"] == ""
    # the cpu controller's cgroup (hybrid: the v1 cpu line, where the CFS quota is)
    assert info["cgroup"] == f"/docker/{DOCKER_ID}"


def test_process_info_in_a_pod_v1_cgroupfs_and_v2_systemd():
    info = hostinfo.process_info(3001, CPROC)
    assert (info["ns_pid"], info["container_id"], info["pod_uid"]) == (1, TRITON_ID, POD1)
    info = hostinfo.process_info(4001, CPROC)
    assert (info["ns_pid"], info["container_id"], info["pod_uid"]) == (7, SGLANG_ID, POD2)
    assert info["pod"] == info["namespace"] == info["container"] == ""  # no kubelet: the UID alone


def test_process_info_names_the_pod_from_the_kubelet():
    from jitterscope.collector.kubelet import PodMeta

    class Kubelet:
        def __init__(self):
            self.asked = []

        def lookup(self, pod_uid, container_id=""):
            self.asked.append((pod_uid, container_id))
            return PodMeta("triton-0", "serving", "triton", {"app": "triton"})

    kubelet = Kubelet()
    info = hostinfo.process_info(3001, CPROC, kubelet)
    assert (info["pod"], info["namespace"], info["container"]) == ("triton-0", "serving", "triton")
    assert kubelet.asked == [(POD1, TRITON_ID)]
    hostinfo.process_info(2001, CPROC, kubelet)  # plain Docker: no pod, nothing to ask
    assert len(kubelet.asked) == 1


@pytest.mark.parametrize("ns_pid, kw, host_pid", [
    (7, {"container_id": DOCKER_ID}, 2002),
    (7, {"container_id": DOCKER_ID[:12]}, 2002),  # docker's short ID
    (1, {"container_id": DOCKER_ID}, 2001),
    (7, {"container_id": SGLANG_ID}, 4001),
    (7, {"pod_uid": POD2}, 4001),
    (7, {"pod_uid": POD2.replace("-", "_")}, 4001),
    (1, {"container_id": TRITON_ID}, 3001),
    (1, {"container_id": TRITON_ID, "pod_uid": POD1}, 3001),
    (7, {}, None),  # two containers have a pid 7: ambiguous
    (1, {}, None),  # the host's init and three containers' inits
    (1, {"pod_uid": POD1}, None),  # both containers of the pod have a pid 1
    (9, {"container_id": DOCKER_ID}, None),  # none
    (7, {"container_id": TRITON_ID}, None),  # that container has no pid 7
    (1, {"container_id": DOCKER_ID, "pod_uid": POD1}, None),  # the container is not in that pod
    (2001, {}, None),  # a host pid is not an innermost pid of a containerised process
    (7, {"peer_cgroup": f"/docker/{DOCKER_ID}"}, 2002),
    (7, {"peer_cgroup": "/system.slice/vllm.service"}, None),
])
def test_host_pid_for(ns_pid, kw, host_pid):
    assert hostinfo.host_pid_for(ns_pid, proc=CPROC, **kw) == host_pid


def test_host_pid_for_a_host_process_is_itself():
    assert hostinfo.host_pid_for(1234, proc=PROC) == 1234
    assert hostinfo.host_pid_for(1, proc=CPROC, peer_cgroup="/") == 1  # the cpu line of 3001 is its container


@pytest.mark.parametrize("ns_pid, cid, uid, answer", [
    (7, DOCKER_ID, "", (2002, "nspid")),
    (99, DOCKER_ID, "", (2001, "container")),  # not found exactly: the container's lowest host pid
    (None, DOCKER_ID, "", (2001, "container")),
    (1, "", POD1, (3001, "container")),  # two pid 1s in the pod: the lowest of them
    (1, "0" * 64, "", (None, "none")),
    (1, "", "", (None, "none")),
])
def test_pid_in_container(ns_pid, cid, uid, answer):
    assert hostinfo.pid_in_container(ns_pid, cid, uid, CPROC) == answer


def test_ns_pids():
    assert hostinfo.ns_pids(2002, CPROC) == [2002, 7]
    assert hostinfo.ns_pids(1234, PROC) == [1234]
    assert hostinfo.ns_pids(99999, CPROC) == []


def test_host_roots(tmp_path):
    from pathlib import Path
    from jitterscope.common.errors import BadConfig
    assert hostinfo.host_roots("/") == (Path("/proc"), Path("/sys"))
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/status").write_text("Name:\tsystemd\n")
    assert hostinfo.host_roots(tmp_path) == (tmp_path / "proc", tmp_path / "sys")
    with pytest.raises(BadConfig, match="host_root"):
        hostinfo.host_roots(tmp_path / "nothing")


def test_own_processes_are_named_by_their_role(tmp_path):
    def process(pid: int, *args: str) -> int:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
        return pid

    from jitterscope.collector.hostinfo import own_role
    worker = process(10, "/opt/js/.venv/bin/python3", "-m", "jitterscope.cli", "streams", "--set", "x=collector")
    collector = process(11, "/opt/js/.venv/bin/jitterscope", "collector")
    broker = process(12, "/root/.cache/jitterscope/tansu-0.6.0", "broker", "--listener-url", "tcp://0:9092")
    other = process(13, "/usr/bin/python3", "-c", "pass")
    helper = process(14, "/opt/js/.venv/bin/python3", "-m", "jitterscope.collector.stacks")
    assert own_role(worker, proc=tmp_path) == "worker"
    assert own_role(helper, proc=tmp_path) == "collector"  # the symbol helper it started
    assert own_role(collector, proc=tmp_path) == "collector"
    assert own_role(broker, proc=tmp_path) == "broker"
    assert own_role(other, proc=tmp_path) == "python3"
    assert own_role(worker, head=worker, proc=tmp_path) == "up"
    assert own_role(os.getpid(), proc=tmp_path) == "collector"  # the collector asking
    assert own_role(99, proc=tmp_path) == "process"  # gone
