# SPDX-License-Identifier: Apache-2.0
"""Self-cost on the real kernel: the BPF statistics count the run-queue
probe's programs while on, and are put back as they were after."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jitterscope.collector.probes.runq import RunqProbe
from jitterscope.collector.selfcost import STATS_SYSCTL, SelfCost

pytestmark = pytest.mark.bpf

MS = 1_000_000


def stats_fds() -> set[int]:
    """This process's BPF_ENABLE_STATS fds (anon inode "bpf-stats")."""
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if "bpf-stats" in os.readlink(fd):
                found.add(int(fd.name))
        except OSError:
            continue
    return found


def switch_contexts(seconds: float) -> None:
    """Sleep in short slices: each one a context switch and a wakeup."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.001)


def test_runq_programs_counted_and_stats_restored():
    sysctl_before, fds_before = STATS_SYSCTL.read_text().strip(), stats_fds()
    with RunqProbe(threshold_ns=1_000 * MS, target_pids=None) as probe:
        cost = SelfCost().start()
        try:
            assert cost.stats.how in ("fd", "sysctl")
            switch_contexts(1.0)
            cost.export([probe])
            fds = probe.program_fds()
            run_ns, runs = cost.by_program()
        finally:
            cost.close()
    names = {n.removeprefix("tracepoint__") for n in fds}
    assert "sched__sched_switch" in names and names <= set(run_ns), (names, run_ns)
    assert runs["sched__sched_switch"] > 0 and run_ns["sched__sched_switch"] > 0
    assert runs["sched__sched_wakeup"] > 0 and run_ns["sched__sched_wakeup"] > 0
    assert cost.bpf_run_ns > 0 and cost.cpu_ns > 0 and cost.rss_bytes > 10 << 20
    share = cost.interval()
    assert 0 < share < 1
    # put back: no enable fd left open, the sysctl as it was
    assert stats_fds() == fds_before
    assert STATS_SYSCTL.read_text().strip() == sysctl_before
