"""collector/hostinfo.py against captured /proc and /sys trees (tests/fixtures)."""

from pathlib import Path

import pytest

from jitterscope.collector import hostinfo
from jitterscope.collector.hostinfo import ProcessGone
from jitterscope.schemas.topology import parse_cpu_list

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
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
        "cpus_allowed": [0, 1, 2, 3],
    }


def test_process_info_keeps_hostile_names_verbatim():
    info = hostinfo.process_info(4321, PROC)
    assert info["comm"] == "<script>[bold]"
    assert info["cmdline"] == "./<script>[bold] --rich=[red]x[/red]"
    assert info["cpus_allowed"] == [4, 5, 6, 7]


def test_process_info_cgroup_v1_takes_the_first_controller():
    assert hostinfo.process_info(4321, PROC)["cgroup"] == "/batch/backup"


def test_process_info_hybrid_cgroup_prefers_the_v2_line():
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
