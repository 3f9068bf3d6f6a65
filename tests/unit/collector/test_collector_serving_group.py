# SPDX-License-Identifier: Apache-2.0
"""The collector's serving groups on this machine's real /proc: a process
that sends spans and the process tree it spawned are described with
``serving_group`` = the span process and get the finer serving threshold;
an unrelated process does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from jitterscope.collector.agent import Collector
from jitterscope.collector.stacks import helper_pids
from jitterscope.common.settings import Settings
from jitterscope.schemas import events
from tests.conftest import wait_until

# a front process whose child spawns a grandchild; all sleep until killed
TREE = ("import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import subprocess, sys, time; subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(60)\"]); "
        "time.sleep(60)'])\n"
        "time.sleep(60)\n")


@pytest.fixture
def tree():
    """(front, engine, worker): a front process, its child and grandchild,
    all killed afterwards (the two it spawned by pid)."""
    front = subprocess.Popen([sys.executable, "-c", TREE])
    spawned: list[int] = []
    try:
        spawned.append(wait_until(lambda: (children(front.pid) or [None])[0], 30, "the front's child"))
        spawned.append(wait_until(lambda: (children(spawned[0]) or [None])[0], 30, "the engine's child"))
        yield front, *spawned
    finally:
        for pid in spawned:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        front.kill()
        front.wait()


class Discard:
    def send(self, topic, batch):
        pass


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def test_span_process_descendants_are_its_serving_group(tmp_path, tree):
    front, engine, worker = tree
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        collector = Collector(Settings(serving_group="auto", serving_threshold_ms=1.0, data_dir=tmp_path,
                                       spool_max_mb=0), publisher=Discard())
        collector._serving_pids.add(front.pid)  # as take_requests does for a span's pid
        collector.update_targets()
        described = {r.pid: r for _, batch in collector.batcher.drain() for r in batch
                     if isinstance(r, events.ProcessInfo)}
        assert {p: described[p].serving_group for p in (front.pid, engine, worker)} == dict.fromkeys(
            (front.pid, engine, worker), front.pid)
        assert neighbour.pid not in described
        assert set(collector.serving_thresholds()) == {front.pid, engine, worker}
        assert collector.serving_thresholds()[engine] == 1_000_000

        # the engine's child exits (a zombie its parent never reaps): out of the group at the next rescan
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while worker in collector.serving_thresholds() and time.monotonic() < deadline:
            collector.update_targets()
            time.sleep(0.1)
        assert set(collector.serving_thresholds()) == {front.pid, engine}
    finally:
        neighbour.kill()
        neighbour.wait()


def test_the_own_tree_is_jitterscopes_own(tmp_path, tree):
    """`up` names itself: its children and theirs (a restarted worker too)
    are jitterscope's own, and so is the collector always."""
    front, engine, worker = tree
    alone = Collector(Settings(data_dir=tmp_path, spool_max_mb=0), publisher=Discard())
    alone.refresh_own()
    # this process's symbol helpers (collector/stacks.py), if an earlier test's are still running, are its own too
    helpers = helper_pids()
    assert alone.own == {os.getpid(): "collector"} | {pid: "collector" for pid in helpers}
    collector = Collector(Settings(data_dir=tmp_path, spool_max_mb=0, own_tree_pid=front.pid), publisher=Discard())
    held = collector.own  # the probes hold this very dict
    collector.update_targets()
    assert held is collector.own and held.keys() == {os.getpid(), front.pid, engine, worker} | helpers
    assert held[os.getpid()] == "collector" and held[front.pid] == "up"  # each named by its role


FORKS_ON_ASK = ("import subprocess, sys, time\n"
                "sys.stdin.readline()\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                "print(child.pid, flush=True)\n"
                "time.sleep(60)\n")


def test_a_group_is_read_from_the_kernels_child_lists_not_a_scan_of_proc(monkeypatch):
    """Issue 39: each rescan read every process's stat to find a head's
    descendants (13 ms of the collector's CPU every 2 s on a 300-process
    host, bench/collector_slices.py); the kernel's own child lists name the
    group, and a process forked after the first look is found at the next."""
    from jitterscope.collector import serving_group

    monkeypatch.setattr(serving_group, "_pids", lambda proc: pytest.fail("read every process in /proc"))
    head = subprocess.Popen([sys.executable, "-c", FORKS_ON_ASK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert serving_group.find_groups({head.pid}, "tree") == {head.pid: head.pid}
        head.stdin.write("\n")
        head.stdin.flush()
        child = int(head.stdout.readline())
        assert serving_group.find_groups({head.pid}, "tree") == {head.pid: head.pid, child: head.pid}
        os.kill(child, signal.SIGKILL)  # a zombie its parent never reaps: no longer a member
        wait_until(lambda: serving_group.find_groups({head.pid}, "tree") == {head.pid: head.pid}, 30, "the zombie left")
    finally:
        head.kill()
        head.wait()
