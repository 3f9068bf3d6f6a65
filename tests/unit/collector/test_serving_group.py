# SPDX-License-Identifier: Apache-2.0
"""collector/serving_group.py: which processes serve a span process's
requests, read from a captured-style /proc tree (descendants by ppid, the
container's cgroup, never the host's root cgroup)."""

from __future__ import annotations

import os
from pathlib import Path

from jitterscope.collector.serving_group import MAX_MEMBERS, find_groups, in_container

HOST_CGROUP = "2:cpu:/\n1:memory:/user.slice\n0::/user.slice/session-1.scope\n"
POD_CGROUP = "2:cpu:/kubepods/pod1/c1\n1:memory:/kubepods/pod1/c1\n0::/\n"


def make_proc(root: Path, processes: dict[int, tuple[int, str, str]]) -> Path:
    """pid -> (ppid, comm, cgroup file); pid 1 is the host's init."""
    proc = root / "proc"
    for pid, (ppid, comm, cgroup) in processes.items():
        d = proc / str(pid)
        (d / "ns").mkdir(parents=True)
        # comm in parentheses may hold spaces and ')': ppid is read after the last ')'
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560\n")
        (d / "cgroup").write_text(cgroup)
        os.symlink("pid:[4026531836]" if cgroup != POD_CGROUP else "pid:[4026532999]", d / "ns/pid")
    return proc


def vllm_host(tmp_path: Path) -> Path:
    return make_proc(tmp_path, {
        1: (0, "systemd", HOST_CGROUP),
        100: (1, "python3", HOST_CGROUP),  # vLLM API server: sends the spans
        200: (100, "VLLM::EngineCor", HOST_CGROUP),  # its engine
        300: (200, "VLLMWorker_TP0", HOST_CGROUP),  # a tensor-parallel worker of the engine
        301: (200, "VLLM::Worker) 1", HOST_CGROUP),  # a comm with ') ' in it
        400: (1, "jshog", HOST_CGROUP),  # a neighbour in the same login session
    })


def test_tree_takes_the_descendants_and_not_the_neighbours(tmp_path):
    proc = vllm_host(tmp_path)
    assert find_groups({100}, "tree", proc) == {100: 100, 200: 100, 300: 100, 301: 100}
    assert find_groups({100}, "auto", proc) == {100: 100, 200: 100, 300: 100, 301: 100}
    assert find_groups({100}, "process", proc) == {100: 100}


def test_cgroup_on_a_bare_host_session_sweeps_in_the_session(tmp_path):
    """Why cgroup is not the default: a login session's cgroup holds the hog too."""
    proc = vllm_host(tmp_path)
    assert 400 in find_groups({100}, "cgroup", proc)


def test_a_container_s_processes_join_in_auto_but_the_root_cgroup_never_does(tmp_path):
    proc = make_proc(tmp_path, {
        1: (0, "systemd", "2:cpu:/\n0::/\n"),
        100: (50, "python3", POD_CGROUP),  # the API server, its parent (the runtime's shim) elsewhere
        110: (50, "VLLM::EngineCor", POD_CGROUP),  # a sibling in the same container
        120: (1, "jshog", "2:cpu:/\n0::/\n"),
        50: (1, "containerd-shim", "2:cpu:/\n0::/\n"),
    })
    assert in_container(100, proc) and not in_container(120, proc)
    assert find_groups({100}, "auto", proc, containers={100}) == {100: 100, 110: 100}
    assert find_groups({100}, "auto", proc, containers=set()) == {100: 100}
    # a span process in the root cgroup: cgroup mode does not make the whole host its group
    assert find_groups({120}, "cgroup", proc) == {120: 120}


def test_exited_span_processes_drop_out_and_groups_are_bounded(tmp_path):
    processes = {1: (0, "systemd", HOST_CGROUP), 100: (1, "python3", HOST_CGROUP)}
    processes.update({1000 + i: (100, "worker", HOST_CGROUP) for i in range(MAX_MEMBERS + 50)})
    proc = make_proc(tmp_path, processes)
    groups = find_groups({100, 99999}, "tree", proc)
    assert 99999 not in groups and groups[100] == 100
    assert len(groups) == MAX_MEMBERS + 1  # the head and at most MAX_MEMBERS others
