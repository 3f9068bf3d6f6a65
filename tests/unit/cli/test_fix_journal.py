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
from jitterscope.fix_journal import JOURNAL, Journal
from jitterscope.reports.fix_plan import Action, read_live

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
