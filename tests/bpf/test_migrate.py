# SPDX-License-Identifier: Apache-2.0
"""The CPU-migration probe on the real kernel: a spinning thread whose
affinity the test flips between CPU 0 and CPU 1. This host has one NUMA
node; a made-up cpu -> node map turns the two CPUs into two nodes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from jitterscope.collector.probes.migrate import MigrationProbe

pytestmark = pytest.mark.bpf

COMM = "jsmigr"
FLIPS = 20

# Spins for a few seconds in its main thread ("main") or in a thread it
# starts when told to ("thread"), after printing the spinner's tid.
_SPINNER = f"""
import ctypes, sys, threading, time
ctypes.CDLL(None).prctl(15, {COMM!r}.encode(), 0, 0, 0)
def spin():
    print(threading.get_native_id(), flush=True)
    end = time.monotonic() + 4
    while time.monotonic() < end:
        pass
if sys.argv[1] == "thread":
    print("ready", flush=True)
    sys.stdin.readline()
    threading.Thread(target=spin).start()
else:
    spin()
"""


@contextmanager
def spinner(mode: str):
    popen = subprocess.Popen([sys.executable, "-c", _SPINNER, mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        yield popen
    finally:
        popen.kill()
        popen.wait()


def flip(*tids: int) -> None:
    """Move the threads between CPU 0 and CPU 1, FLIPS times."""
    for i in range(FLIPS):
        for tid in tids:
            os.sched_setaffinity(tid, {(i + 1) % 2})
        time.sleep(0.01)


def drain(probe: MigrationProbe) -> None:
    """Let the last moves land (the counts are in a map: nothing to poll)."""
    probe.poll(0)  # a no-op: cross-node moves no longer leave one by one
    time.sleep(0.3)


def test_counts_of_a_target_thread_and_cross_node_moves():
    with spinner("main") as target, spinner("main") as other:
        tid = int(target.stdout.readline())
        other_tid = int(other.stdout.readline())
        # the target's thread is older than the probe: seeded from /proc
        with MigrationProbe(cpu_node={0: 0, 1: 1}, target_pids={target.pid}) as probe:
            flip(tid, other_tid)
            drain(probe)
            counts = probe.read_counts()
            again = probe.read_counts()
            assert probe.drops() == 0 and probe.map_full_drops() == 0

    assert set(counts) == {tid}, "only the target process's threads are counted"
    c = counts[tid]
    assert (c.pid, c.comm) == (target.pid, COMM)
    assert c.migrations >= FLIPS // 2
    assert c.cross_node >= FLIPS // 2 and c.cross_node <= c.migrations
    assert c.last_cpu in (0, 1)
    assert again == {}, "a read returns only what is new since the previous one"


def test_one_node_means_no_cross_node_moves_for_a_thread_born_under_the_probe():
    with spinner("thread") as proc:
        assert proc.stdout.readline().strip() == "ready"
        with MigrationProbe(cpu_node={0: 0, 1: 0}, target_pids=None) as probe:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            tid = int(proc.stdout.readline())  # a thread the kernel saw being cloned
            flip(tid)
            drain(probe)
            counts = probe.read_counts()
            proc.kill()
            proc.wait()
            time.sleep(0.05)
            after_exit = probe.read_counts()
            assert tid not in probe.read_counts()

    assert tid != proc.pid
    c = counts[tid]
    assert (c.pid, c.comm) == (proc.pid, COMM), "tgid learned in the kernel at clone"
    assert c.migrations >= FLIPS // 2 and c.cross_node == 0
    assert after_exit.get(tid) is None or after_exit[tid].cross_node == 0
