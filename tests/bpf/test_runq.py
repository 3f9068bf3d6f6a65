# SPDX-License-Identifier: Apache-2.0
"""The run-queue probe on the real kernel, without Kafka: what it reports
and what its filters keep out."""

from __future__ import annotations

import time

import pytest

from jitterscope.collector.probes.runq import RunqProbe
from jitterscope.workload import HOG_COMM, VICTIM_COMM, last_cpu, starvation

pytestmark = pytest.mark.bpf

MS = 1_000_000


def poll_for(probe: RunqProbe, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        probe.poll(50)
    probe.poll(0)


def collect(probe: RunqProbe, seconds: float) -> list:
    seen = []
    probe.open(seen.append)
    poll_for(probe, seconds)
    return seen


def test_waits_of_the_target_only_with_the_hog_as_suspect():
    # the probe is compiled first: under load that takes seconds
    with RunqProbe(threshold_ns=5 * MS, target_pids=set()) as probe:
        with starvation(seconds=4, hogs=3, delay=0.5) as victim:
            probe.set_targets({victim.pid})
            seen = collect(probe, 4)
            hist = probe.read_histograms()
            assert probe.drops() == 0 and probe.map_full_drops() == 0
    assert seen, "a victim sharing its CPU with 3 hogs waits >= 5 ms"
    assert {e.pid for e in seen} == {victim.pid}, "only the target's waits leave the kernel"
    assert all(e.tid == victim.pid for e in seen)
    # it is named "python3" until the interpreter has started and renamed it
    assert VICTIM_COMM in {e.comm for e in seen} and {e.comm for e in seen} <= {VICTIM_COMM, "python3", "python"}
    assert all(e.wait_ns >= 5 * MS and e.cpu == last_cpu() for e in seen)
    assert max(e.wait_ns for e in seen) >= 10 * MS
    assert HOG_COMM in {e.suspect_comm for e in seen}
    assert all(e.suspect_pid != victim.pid for e in seen if e.suspect_comm == HOG_COMM)
    # the histogram holds every wait of the target, the short ones too
    assert set(hist) == {victim.pid}
    assert sum(hist[victim.pid].values()) > len(seen)
    assert min(hist[victim.pid]) < 5  # waits under 32 us exist as well


def test_threshold_and_histogram_deltas():
    with RunqProbe(threshold_ns=1_000 * MS, target_pids=set()) as probe:
        with starvation(seconds=3, hogs=1, delay=0.3) as victim:
            probe.set_targets({victim.pid})
            seen = collect(probe, 1.5)
            first = probe.read_histograms()
            poll_for(probe, 1.0)
            second = probe.read_histograms()
        # once the victim has exited nothing new can arrive: the next read
        # takes its last waits, and one more finds nothing new
        probe.read_histograms()
        again = probe.read_histograms()
    assert seen == [], "no wait reaches a 1 s threshold"
    assert sum(first[victim.pid].values()) > 0 and sum(second[victim.pid].values()) > 0
    assert again == {}, "a read returns only what is new since the previous one"


def test_unfiltered_probe_sees_other_processes():
    with RunqProbe(threshold_ns=5 * MS, target_pids=None) as probe:
        with starvation(seconds=3, hogs=2, delay=0.3):
            seen = collect(probe, 2.5)
    comms = {e.comm for e in seen}
    assert HOG_COMM in comms and VICTIM_COMM in comms
    assert all(e.tid != 0 for e in seen), "the idle task (pid 0) is never reported as a waiter"


def test_a_process_can_have_its_own_finer_threshold():
    # nothing else reaches 1 s; the victim (a serving process) reports from 2 ms
    with RunqProbe(threshold_ns=1_000 * MS, target_pids=None) as probe:
        with starvation(seconds=3, hogs=3, delay=0.3) as victim:
            probe.set_targets(set(), {victim.pid: 2 * MS})
            seen = collect(probe, 2.5)
    assert seen and {e.pid for e in seen} == {victim.pid}
    assert min(e.wait_ns for e in seen) >= 2 * MS
