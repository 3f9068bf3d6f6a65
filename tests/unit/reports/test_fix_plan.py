# SPDX-License-Identifier: Apache-2.0
"""The fix plan (issue 35, step 1): actions merge the requests they answer,
their gain is the P99/P999 the serving group loses without their cause,
and nothing is offered that would move the serving group, jitterscope, the
kernel, another container, or that the host cannot do."""

from __future__ import annotations

import os

from jitterscope.reports.fix_plan import Live, Process, Request, format_plan, percentile, plan, read_live

MS = 1_000_000
SERVER, HOG, OTHER_HOG, CONTAINED = 100, 200, 201, 300
PROCESSES = {
    SERVER: Process(SERVER, "jsinfer", (1,), serving_group=SERVER),
    HOG: Process(HOG, "jshog", (0, 1)),
    OTHER_HOG: Process(OTHER_HOG, "backup", (0, 1)),
    CONTAINED: Process(CONTAINED, "tenant", (0, 1), container_id="abc"),
}


def live(pid: int) -> Live | None:
    return Live(PROCESSES[pid].cpus_allowed, 1000 + pid) if pid in PROCESSES else None


def request(ms: float, cause="runq_starvation", suspects=((HOG, "jshog", 10 * MS),), causes=None, culprit="jshog"):
    excess = max(0, int((ms - 10) * MS))
    return Request(SERVER, int(ms * MS), excess, cause, culprit, tuple(causes or ((cause, 1.0),)), tuple(suspects))


def test_a_neighbour_is_one_action_whose_gain_is_the_tail_it_explains():
    quiet = [request(10, cause="none", suspects=(), causes=(("none", 0.0),)) for _ in range(900)]
    starved = [request(110) for _ in range(100)]  # 100 ms of excess each, all behind jshog
    actions, not_offered = plan(quiet + starved, PROCESSES, [0, 1], live)
    assert [a.key for a in actions] == ["move:jshog"], "a hundred requests, one action"
    [move] = actions
    assert move.requests == 100 and move.gain_p99_ms == 100.0 and move.gain_p999_ms == 100.0
    assert move.command == f"taskset -apc 0 {HOG}" and move.undo == f"taskset -apc 0-1 {HOG}"
    assert "0-1 -> 0" in move.change and move.moves == {HOG: (1000 + HOG, (0, 1))}
    assert not_offered == []


def test_every_process_of_a_command_moves_together():
    """One of five hogs moved leaves four in the way: the command is the neighbour."""
    hogs = {pid: Process(pid, "jshog", (1,)) for pid in range(500, 505)}
    suspects = tuple((pid, "jshog", 10 * MS) for pid in hogs)
    actions, _ = plan([request(10, cause="none", suspects=(), causes=(("none", 0),)) for _ in range(90)]
                      + [request(60, suspects=suspects) for _ in range(10)], {**PROCESSES, **hogs}, [0, 1],
                      lambda pid: Live((1,), pid))
    [move] = actions
    assert sorted(move.moves) == sorted(hogs) and move.gain_p99_ms == 50.0
    assert move.command.count("taskset -apc 0 ") == 5 and "jshog (pid 500, 501, 502, 503, 504)" == move.target


def test_the_wait_is_split_between_suspects_and_ranked_by_what_it_takes_off():
    both = ((HOG, "jshog", 30 * MS), (OTHER_HOG, "backup", 10 * MS))
    actions, _ = plan([request(10, cause="none", suspects=(), causes=(("none", 0),)) for _ in range(90)]
                      + [request(90, suspects=both) for _ in range(10)], PROCESSES, [0, 1], live)
    assert [a.key for a in actions] == ["move:jshog", "move:backup"]
    assert actions[0].gain_p99_ms == 60.0 and actions[1].gain_p99_ms == 20.0  # 80 ms of excess, 3:1


def test_the_serving_group_jitterscope_the_kernel_and_containers_are_never_moved():
    suspects = ((SERVER, "jsinfer", MS), (400, "jitterscope:worker", MS), (0, "swapper/1", MS),
                (CONTAINED, "tenant", MS), (999, "kworker/1:0", MS))
    actions, not_offered = plan([request(50, suspects=suspects)], PROCESSES, [0, 1], live)
    assert actions == []
    reasons = " ".join(not_offered)
    for why in ("serving group", "jitterscope's own", "the kernel", "another container", "no process record"):
        assert why in reasons, not_offered


def test_a_move_the_host_cannot_make_is_not_offered():
    everywhere = {**PROCESSES, SERVER: Process(SERVER, "jsinfer", (0, 1), serving_group=SERVER)}
    actions, not_offered = plan([request(50)], everywhere, [0, 1], lambda pid: None if pid == SERVER else live(pid))
    assert actions == [] and "nowhere to move it" in not_offered[0]


def test_a_serving_thread_pinned_alone_still_leaves_its_other_threads_cpus_serving():
    """The serving thread pinned to CPU 1, its exporter (which holds the GIL at times) on 0-1: moving
    the hogs to CPU 0 starves the exporter, and the serving thread then waits for the GIL."""
    pinned_alone = lambda pid: Live((1,), pid, (0, 1)) if pid == SERVER else live(pid)  # noqa: E731
    actions, not_offered = plan([request(50)], PROCESSES, [0, 1], pinned_alone)
    assert actions == [] and "nowhere to move it" in not_offered[0]


def test_a_neighbour_that_exited_is_not_offered():
    actions, not_offered = plan([request(50)], PROCESSES, [0, 1], lambda pid: None)
    assert actions == [] and "exited" in not_offered[0]


def test_causes_without_a_change_of_ours_are_advice_with_their_gain():
    gil = request(60, cause="gil_contention", suspects=(), culprit="gil-hog[77]")
    actions, _ = plan([gil, request(10, cause="none", suspects=(), causes=(("none", 0),))], PROCESSES, [0, 1], live)
    [advice] = actions
    assert advice.key == "advice:gil_contention:gil-hog[77]" and advice.command == ""
    assert "GIL" in advice.advice and advice.gain_p99_ms == 50.0
    text = "\n".join(format_plan(actions, [], "vm", "30m", 2))
    assert "advice:" in text and "P99 -50 ms" in text


def test_stacked_causes_each_take_their_share():
    mixed = request(110, causes=(("runq_starvation", 0.6), ("gil_contention", 0.4)), culprit="jshog")
    actions, _ = plan([mixed], PROCESSES, [0, 1], live)
    gains = {a.cause: a.gain_p99_ms for a in actions}
    assert gains == {"runq_starvation": 60.0, "gil_contention": 40.0}


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.99) == 99.0 and percentile(values, 0.5) == 50.0 and percentile([], 0.99) == 0.0


def test_read_live_reads_this_process():
    now = read_live(os.getpid())
    assert now is not None and set(now.cpus_allowed) == os.sched_getaffinity(0) and now.start_ticks > 0
    assert set(now.thread_cpus) >= set(now.cpus_allowed) and not now.kernel
    kthreadd = read_live(2)  # the kernel's thread that starts the others
    assert kthreadd is None or kthreadd.kernel
    assert read_live(2**22 + 1) is None


def test_a_serving_group_in_a_pod_gets_the_kubelets_advice_not_a_taskset():
    in_pod = {**PROCESSES, SERVER: Process(SERVER, "vllm", (1,), serving_group=SERVER, container_id="c0ffee")}
    actions, _ = plan([request(60)], in_pod, [0, 1], live)
    [advice] = actions
    assert advice.key == "advice:runq_starvation:jshog" and not advice.moves and "cpu-manager-policy=static" in advice.advice


def test_a_neighbour_not_yet_described_in_the_store_is_described_by_the_host():
    """A busy collector describes new processes a little later: the plan asks this host."""
    late = Process(600, "jshog", (1,))
    actions, not_offered = plan([request(60, suspects=((600, "jshog", 10 * MS),))], dict(PROCESSES), [0, 1],
                                lambda pid: Live((1,), pid), lambda pid: late if pid == 600 else None)
    assert [sorted(a.moves) for a in actions] == [[600]] and not_offered == []
    # a kernel thread is told by the kernel's flag, not by a record's empty command line
    kernel = Process(601, "kworker/1:2", (1,))
    _, not_offered = plan([request(60, suspects=((601, "kworker/1:2", 10 * MS),))], dict(PROCESSES), [0, 1],
                          lambda pid: Live((1,), pid, kernel=True), lambda pid: kernel)
    assert "a kernel thread" in not_offered[0]


def test_a_throttled_serving_group_s_cpu_limit_is_lifted_once_with_its_undo():
    from jitterscope.reports.fix_plan import Limit

    limit = Limit("/sys/fs/cgroup/cpu/serving/cpu.cfs_quota_us", "20000", "-1")
    throttled = [request(60, cause="cfs_throttling", suspects=(), culprit="/serving") for _ in range(10)]
    quiet = [request(10, cause="none", suspects=(), causes=(("none", 0),)) for _ in range(90)]
    actions, not_offered = plan(quiet + throttled, PROCESSES, [0, 1], live, limit_of={"/serving": limit}.get)
    [lift] = actions
    assert (lift.key, lift.cause, lift.requests, lift.gain_p99_ms) == ("lift:/serving", "cfs_throttling", 10, 50.0)
    assert lift.command == f"echo -1 > {limit.file}" and lift.undo == f"echo 20000 > {limit.file}"
    assert "20000 -> -1" in lift.change and not_offered == []
    # no limit there now (lifted already): advice, and said why; in a pod: the pod-level advice, never its cgroup
    actions, not_offered = plan(quiet + throttled, PROCESSES, [0, 1], live, limit_of=lambda cgroup: None)
    assert [a.key for a in actions] == ["advice:cfs_throttling:/serving"] and "no CPU limit to lift" in not_offered[0]
    podded = {**PROCESSES, SERVER: Process(SERVER, "jsinfer", (1,), serving_group=SERVER, container_id="pod")}
    actions, _ = plan(quiet + throttled, podded, [0, 1], live, limit_of={"/serving": limit}.get)
    assert [a.key for a in actions] == ["advice:cfs_throttling:/serving"]


def test_an_evictor_gets_a_memory_cgroup_of_its_own_with_its_undo():
    from jitterscope.reports.fix_plan import CONFINE_BYTES, MemoryHome

    home = MemoryHome("/sys/fs/cgroup/memory/serving/cgroup.procs", "/sys/fs/cgroup/memory", False)
    stalled = [request(60, cause="memory_stall", suspects=(), culprit=f"backup (pid {OTHER_HOG})") for _ in range(10)]
    quiet = [request(10, cause="none", suspects=(), causes=(("none", 0),)) for _ in range(90)]
    actions, not_offered = plan(quiet + stalled, PROCESSES, [0, 1], live, memory_of=lambda pid: home)
    [confine] = actions
    folder = "/sys/fs/cgroup/memory/jitterscope-confined-backup"
    assert (confine.key, confine.cause, confine.requests, confine.gain_p99_ms) == ("confine:backup", "memory_stall",
                                                                                   10, 50.0)
    assert confine.confine.moves == {OTHER_HOG: (1000 + OTHER_HOG, home.procs)} and not_offered == []
    assert confine.command == (f"mkdir {folder}; echo {CONFINE_BYTES} > {folder}/memory.limit_in_bytes; "
                               f"echo {OTHER_HOG} > {folder}/cgroup.procs")
    assert confine.undo == f"echo {OTHER_HOG} > {home.procs}; rmdir {folder}"
    # a limit is never below twice what it holds that no reclaim can free (no OOM kill)
    v2 = MemoryHome("/sys/fs/cgroup/serving/cgroup.procs", "/sys/fs/cgroup", True, anon_bytes=100 << 20)
    [confine] = plan(stalled, PROCESSES, [0, 1], live, memory_of=lambda pid: v2, confine_bytes=64 << 20)[0]
    assert confine.command.split("; ")[1] == "echo 209715200 > /sys/fs/cgroup/jitterscope-confined-backup/memory.max"
    assert "200 MiB" in confine.change


def test_an_evictor_that_may_not_or_cannot_be_confined_is_advice_and_said_why():
    from jitterscope.reports.fix_plan import MemoryHome

    home = MemoryHome("/sys/fs/cgroup/memory/serving/cgroup.procs", "/sys/fs/cgroup/memory", False)
    confined = MemoryHome("/sys/fs/cgroup/memory/jitterscope-confined-backup/cgroup.procs", "/sys/fs/cgroup/memory",
                          False)
    for culprit, memory_of, why in ((f"jsinfer (pid {SERVER})", lambda pid: home, "serving group"),
                                    (f"tenant (pid {CONTAINED})", lambda pid: home, "another container"),
                                    (f"backup (pid {OTHER_HOG})", lambda pid: None, "no memory controller"),
                                    (f"backup (pid {OTHER_HOG})", lambda pid: confined, "of its own already"),
                                    (f"gone (pid {2**22 + 1})", lambda pid: home, "no process record")):
        stalled = request(60, cause="memory_stall", suspects=(), culprit=culprit)
        actions, not_offered = plan([stalled], PROCESSES, [0, 1], live, memory_of=memory_of)
        assert [a.key for a in actions] == [f"advice:memory_stall:{culprit}"], culprit
        assert len(not_offered) == 1 and why in not_offered[0], (culprit, not_offered)
    # a name is a process's own choice: it never makes a path
    sly = {**PROCESSES, 400: Process(400, "../../x", (0, 1))}
    stalled = request(60, cause="memory_stall", suspects=(), culprit="../../x (pid 400)")
    [confine] = plan([stalled], sly, [0, 1], lambda pid: Live((0, 1), 1400), memory_of=lambda pid: home)[0]
    assert confine.confine.dir == "/sys/fs/cgroup/memory/jitterscope-confined-.._.._x"
