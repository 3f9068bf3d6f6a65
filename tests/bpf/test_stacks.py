# SPDX-License-Identifier: Apache-2.0
"""Stacks at alarm on the real kernel: a CPU hog built with frame pointers
shares a CPU with a CPU-hungry victim; the culprit stack of the victim's
run-queue events names the hog's busy loop, and the victim's own stack (where
it was preempted) names its work function."""

from __future__ import annotations

import time

import pytest

from jitterscope.collector.probes.runq import RunqProbe, RunqStacks
from jitterscope.workload import last_cpu
from tests.bpf import fphog

pytestmark = pytest.mark.bpf

MS = 1_000_000


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return fphog.build(tmp_path_factory.mktemp("fphog"))


class Recorder:
    """Events with their stacks resolved the way the collector does it."""

    def __init__(self, probe: RunqProbe):
        self.published: list[tuple] = []
        self.reader = RunqStacks(lambda *stack: self.published.append(stack))
        self.events: list[tuple] = []  # (raw, victim stack id, suspect stack id)
        self.probe = probe

    def on_event(self, raw) -> None:
        self.events.append((raw, *self.reader.of_event(raw, raw.pid)))

    def stacks(self) -> dict[int, tuple]:
        return {s[0]: s for s in self.published}  # id -> (id, pid, comm, kernel, user)

    def poll_until(self, done, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not done():
            self.probe.poll(50)
        self.probe.poll(0)


def test_culprit_and_victim_stacks_name_their_functions(binary):
    with RunqProbe(threshold_ns=1_000 * MS, target_pids=None) as probe:
        rec = Recorder(probe)
        probe.open(rec.on_event)
        with fphog.contention(binary, last_cpu(), seconds=40) as victim:
            # a serving process: its own fine threshold, so its preemptions get stacks
            probe.set_targets(set(), {victim.pid: 1 * MS})

            def found(role: int, function: str) -> bool:
                stacks = rec.stacks()
                return any(function in stacks[e[role]][4] for e in rec.events if e[role])

            rec.poll_until(lambda: found(2, fphog.HOG_FUNCTION) and found(1, fphog.VICTIM_FUNCTION), 40)
        rec.poll_until(lambda: False, 0.2)
        stacks = rec.stacks()
        assert rec.events and all(e[0].pid == victim.pid for e in rec.events), "only the victim's waits reach 1 ms"
        culprits = [stacks[s] for _, _, s in rec.events if s]
        assert any(fphog.HOG_FUNCTION in user for _, _, _, _, user in culprits), \
            f"the hog's busy loop in a culprit stack: {[c[4] for c in culprits][:5]}"
        # (other tasks on this shared machine may hold the CPU now and then)
        assert all(comm == fphog.HOG_COMM for _, _, comm, _, user in culprits if fphog.HOG_FUNCTION in user)
        victims = [stacks[v] for _, v, _ in rec.events if v]
        assert victims and all(kernel for _, _, _, kernel, _ in victims), "a preempted victim has a kernel stack"
        assert any(fphog.VICTIM_FUNCTION in user for _, _, _, _, user in victims)
        assert all(comm == fphog.VICTIM_COMM for _, _, comm, _, _ in victims)
        assert len(rec.published) == len(stacks), "each distinct stack is published once"
        assert probe.map_full_drops() == 0 and probe.drops() == 0



def test_victim_stacks_only_for_serving_or_chosen_processes(binary):
    # every process watched, no finer thresholds: waits leave the kernel with
    # the culprit's stack, but no preemption is worth a stack walk
    with RunqProbe(threshold_ns=1 * MS, target_pids=None) as probe:
        seen = []
        probe.open(seen.append)
        with fphog.contention(binary, last_cpu(), seconds=20):
            end = time.monotonic() + 20
            while time.monotonic() < end and sum(bool(e.suspect_user) for e in seen) < 5:
                probe.poll(50)
    assert sum(bool(e.suspect_user) for e in seen) >= 5
    assert not any(e.victim_kernel or e.victim_user for e in seen)


def test_no_stacks_when_turned_off(binary):
    with RunqProbe(threshold_ns=1 * MS, target_pids=set(), stacks=False) as probe:
        seen = []
        probe.open(seen.append)
        with fphog.contention(binary, last_cpu(), seconds=20) as victim:
            probe.set_targets({victim.pid})
            end = time.monotonic() + 20
            while time.monotonic() < end and len(seen) < 5:
                probe.poll(50)
        assert len(seen) >= 5
        assert not any(e.victim_kernel or e.victim_user or e.suspect_kernel or e.suspect_user for e in seen)


def test_no_stacks_for_waits_under_the_floor(binary):
    """Stacks only for waits of ``stacks_from_ns`` or more (the collector's:
    the alert level): a serving thread's ~8 ms waits under a 1 s floor leave
    the kernel as events, without a stack walk, its own or its culprit's."""
    with RunqProbe(threshold_ns=1_000 * MS, target_pids=None, stacks_from_ns=1_000 * MS) as probe:
        seen = []
        probe.open(seen.append)
        with fphog.contention(binary, last_cpu(), seconds=20) as victim:
            probe.set_targets(set(), {victim.pid: 1 * MS})  # its preemptions would be worth a stack
            end = time.monotonic() + 20
            while time.monotonic() < end and len(seen) < 20:
                probe.poll(50)
        assert len(seen) >= 20 and all(e.wait_ns < 1_000 * MS for e in seen)
        assert not any(e.victim_kernel or e.victim_user or e.suspect_kernel or e.suspect_user for e in seen)
