# SPDX-License-Identifier: Apache-2.0
"""`fix --apply/--diff/--undo` on a real child process: the move is
journaled (0600) before it is made, applying twice changes nothing more,
undo restores every thread, and what the plan did not offer, advice, or a
process that is not the one planned is refused before any change."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from jitterscope.common import errors
from jitterscope.fix_journal import JOURNAL, Journal, read_limit
from jitterscope.reports.fix_plan import Action, read_live
from tests.conftest import remove_cgroup

THREADED = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"


@pytest.fixture
def neighbour():
    child = subprocess.Popen([sys.executable, "-c", THREADED], preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    while len(os.listdir(f"/proc/{child.pid}/task")) < 2:  # its second thread started
        pass
    yield child
    child.kill()
    child.wait()


def cpus_of_threads(pid: int) -> set[tuple[int, ...]]:
    return {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(f"/proc/{pid}/task")}


def move(pid: int, to: int = 1) -> Action:
    now = read_live(pid)
    return Action("move:neighbour", "runq_starvation", f"neighbour (pid {pid})",
                  moves={pid: (now.start_ticks, now.cpus_allowed)}, to_cpus=(to,))


def test_apply_journals_then_moves_every_thread_and_undo_restores(neighbour, tmp_path):
    journal, action = Journal(tmp_path), move(neighbour.pid)
    assert journal.apply([action], [action.key], diff=True) == [f"would set {action.key}: pid {neighbour.pid} CPUs 0 -> 1"]
    assert cpus_of_threads(neighbour.pid) == {(0,)} and not (tmp_path / JOURNAL).exists(), "a diff changes nothing"
    journal.apply([action], [action.key])
    assert cpus_of_threads(neighbour.pid) == {(1,)}
    assert stat.S_IMODE((tmp_path / JOURNAL).stat().st_mode) == 0o600
    [change] = journal.changes()
    assert (change.before, change.after, change.pid) == ([0], [1], neighbour.pid)
    assert "already on CPUs 1" in journal.apply([action], [action.key])[0] and len(journal.changes()) == 1
    assert journal.undo() == [f"{action.key}: pid {neighbour.pid} back on CPUs 0"]
    assert cpus_of_threads(neighbour.pid) == {(0,)}
    assert journal.undo() == ["nothing to undo"], "undo is idempotent"


def test_refused_before_any_change(neighbour, tmp_path):
    journal, action = Journal(tmp_path), move(neighbour.pid)
    advice = Action("advice:gil_contention", "gil_contention", "holder", advice="the GIL")
    reused = Action("move:reused", action.cause, action.target, to_cpus=(1,),
                    moves={neighbour.pid: (action.moves[neighbour.pid][0] + 1, (0,))})
    for actions, key, why in (([action], "move:other:1", "not in this plan"), ([action, advice], advice.key, "is advice"),
                              ([action, reused], reused.key, "not the process the plan named")):
        with pytest.raises(errors.BadConfig, match=why):
            journal.apply(actions, [action.key, key])
    assert cpus_of_threads(neighbour.pid) == {(0,)} and journal.changes() == []


def test_undo_says_what_it_cannot_undo(neighbour, tmp_path):
    journal, action = Journal(tmp_path), move(neighbour.pid)
    journal.apply([action], [action.key])
    neighbour.kill()
    neighbour.wait()
    assert "cannot undo: pid" in journal.undo()[0]


@pytest.fixture
def quota_group():
    """A cpu cgroup of this test's with a quota (v1 cpu.cfs_quota_us, or v2 cpu.max): the throttled serving
    group's limit, on the real kernel."""
    from pathlib import Path

    v1 = Path("/sys/fs/cgroup/cpu")
    root = v1 if (v1 / "cpu.cfs_quota_us").exists() else Path("/sys/fs/cgroup")
    group = root / f"jitterscope-fixtest-{os.getpid()}"
    group.mkdir()
    (group / ("cpu.cfs_quota_us" if root == v1 else "cpu.max")).write_text("20000" if root == v1 else "20000 100000")
    yield "/" + group.relative_to(root).as_posix(), group, root == v1
    remove_cgroup(group)


def test_a_cgroup_s_cpu_limit_is_lifted_journaled_and_put_back(quota_group, tmp_path):
    path, group, v1 = quota_group
    file = group / ("cpu.cfs_quota_us" if v1 else "cpu.max")
    limit = read_limit(path)
    assert limit is not None and (limit.file, limit.now, limit.lifted) == (
        str(file), "20000" if v1 else "20000 100000", "-1" if v1 else "max")
    action = Action(f"lift:{path}", "cfs_throttling", path, writes={limit.file: (limit.now, limit.lifted)})
    journal = Journal(tmp_path)
    assert journal.apply([action], [action.key], diff=True)[0].startswith("would set ")
    assert file.read_text().split()[0] == "20000", "a diff changes nothing"
    assert journal.apply([action], [action.key])[0].startswith("set ")
    assert file.read_text().split()[0] == ("-1" if v1 else "max") and read_limit(path) is None
    assert "already" in journal.apply([action], [action.key])[0] and len(journal.changes()) == 1, "idempotent"
    assert journal.undo() == [f"{action.key}: {file} back to {limit.now!r}"]
    assert file.read_text().split()[0] == "20000" and journal.undo() == ["nothing to undo"]
    # the limit changed since the plan read it: refused, nothing written
    file.write_text("30000" if v1 else "30000 100000")
    with pytest.raises(errors.BadConfig, match="no longer"):
        journal.apply([action], [action.key])
    assert file.read_text().split()[0] == "30000"


@pytest.fixture
def evictor_in_a_memory_limit():
    """A process named uniquely (its confinement cgroup's name comes from it) in a memory cgroup of this test's,
    as a log archiver shares the server's limit; on the real kernel (v1 memory controller, or v2)."""
    import uuid
    from pathlib import Path

    from jitterscope.fix_journal import memory_home

    name = f"evict-{uuid.uuid4().hex[:8]}"
    home = memory_home(os.getpid())
    assert home is not None, "no memory controller: mount cgroup v1's memory hierarchy, or enable v2's"
    group = Path(home.root) / f"jitterscope-fixtest-{name}"
    group.mkdir()
    child = subprocess.Popen([sys.executable, "-c", f"open('/proc/self/comm', 'w').write({name!r}); "
                              "import time; time.sleep(60)"],
                             preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    while Path(f"/proc/{child.pid}/comm").read_text().strip() != name:
        assert child.poll() is None, "the evictor stand-in did not start"
    yield child, name, group, Path(home.root)
    child.kill()
    child.wait()
    for made in (group, Path(home.root) / f"jitterscope-confined-{name}"):
        if made.exists():
            remove_cgroup(made)


def test_an_evictor_is_confined_in_a_memory_cgroup_of_its_own_journaled_and_put_back(evictor_in_a_memory_limit,
                                                                                     tmp_path):
    from pathlib import Path

    from jitterscope.fix_journal import memory_home
    from jitterscope.reports.fix_plan import Process, Request, plan

    child, name, group, root = evictor_in_a_memory_limit
    stalled = Request(1, 60_000_000, 50_000_000, "memory_stall", f"{name} (pid {child.pid})",
                      (("memory_stall", 1.0),), ())
    [action], _ = plan([stalled], {child.pid: Process(child.pid, name, (0,))}, [0, 1], read_live,
                       memory_of=memory_home, confine_bytes=64 << 20)
    confined = root / f"jitterscope-confined-{name}"
    v2 = not (root / "memory.limit_in_bytes").exists()
    limit_file = confined / ("memory.max" if v2 else "memory.limit_in_bytes")
    assert action.key == f"confine:{name}" and action.confine.moves[child.pid][1] == str(group / "cgroup.procs")

    def memory_cgroup() -> str:
        return memory_home(child.pid).procs.rsplit("/", 1)[0]

    journal = Journal(tmp_path)
    assert [line.split()[:2] for line in journal.apply([action], [action.key], diff=True)] == [
        ["would", "make"], ["would", "set"], ["would", "move"]]
    assert not confined.exists() and memory_cgroup() == str(group), "a diff changes nothing"
    journal.apply([action], [action.key])
    assert memory_cgroup() == str(confined) and limit_file.read_text().strip() == str(64 << 20)
    made = len(journal.changes())
    assert made == 3 and "already" in journal.apply([action], [action.key])[-1]
    assert len(journal.changes()) == made, "idempotent"
    undone = journal.undo()
    assert (undone[0], undone[-1]) == (f"{action.key}: pid {child.pid} back in {group}",
                                       f"{action.key}: removed {confined}")
    assert f"{action.key}: {limit_file} back to " in undone[-2]
    assert memory_cgroup() == str(group) and not Path(confined).exists()
    assert journal.undo() == ["nothing to undo"]
