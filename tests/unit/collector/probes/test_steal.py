# SPDX-License-Identifier: Apache-2.0
"""collector/probes/irq.py steal_ticks: the time the hypervisor took each
vCPU, from /proc/stat, as the irq signal's "steal" source (issue 34 item 5)."""

from __future__ import annotations

import os

from jitterscope.collector.probes.irq import IrqSum, diff, steal_ticks

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def proc_stat(tmp_path, cpus: list[int]):
    rows = "".join(f"cpu{n} 100 0 50 900 3 0 2 {steal} 0 0\n" for n, steal in enumerate(cpus))
    (tmp_path / "stat").write_text(f"cpu  200 0 100 1800 6 0 4 {sum(cpus)} 0 0\n{rows}intr 12345 0 1\nctxt 999\n")
    return tmp_path


def test_each_vcpu_s_steal_is_read_and_a_cpu_with_none_is_left_out(tmp_path):
    assert steal_ticks(proc_stat(tmp_path, [300, 0, 7])) == {("steal", 0, 0): (300, 300 * TICK_NS),
                                                            ("steal", 2, 0): (7, 7 * TICK_NS)}


def test_a_read_since_the_last_is_the_steal_in_between(tmp_path):
    before = steal_ticks(proc_stat(tmp_path, [300, 0]))
    after = steal_ticks(proc_stat(tmp_path, [305, 2]))
    assert diff(after, before) == {("steal", 0, 0): IrqSum(5, 5 * TICK_NS), ("steal", 1, 0): IrqSum(2, 2 * TICK_NS)}
    assert diff(after, after) == {}, "no new steal, no record"


def test_no_proc_stat_is_no_steal_and_this_host_s_reads(tmp_path):
    assert steal_ticks(tmp_path) == {}
    for (kind, cpu, _), (ticks, ns) in steal_ticks().items():  # a VM counts some; bare metal none
        assert kind == "steal" and 0 <= cpu < os.cpu_count() and ns == ticks * TICK_NS > 0
