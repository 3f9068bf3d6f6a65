# SPDX-License-Identifier: Apache-2.0
"""The IRQ-time probe on the real kernel, checked against the kernel's own
counters: loopback UDP traffic pinned to the last CPU (NET_RX softirqs on
that CPU: a loopback send queues the packet on the sending CPU's backlog)
and fsync'd writes (the disk's completion interrupts).

The bounds: /proc/softirqs and /proc/interrupts are read just before and
just after each read of the probe. The probe's delta covers a span that
contains [after the first read, before the second] and lies in [before the
first read, after the second], so the kernel's inner delta <= the probe's
count <= its outer delta. One handler per CPU and source may be in flight
at each probe read (the kernel counts a run on entry, the probe on exit),
hence the slack of 1 on each side. Below, a further 5% or 2 runs, whichever
is more: on this shared machine, with other sessions loading and unloading
BPF programs on the same tracepoints, a run of this test now and then
counted up to 4% fewer runs of a source than the kernel did (every program
run accounted for: entry and exit run counts equal, no recursion misses),
and once (CI) 12 RCU softirqs of the kernel's 14; alone it is exact. So
misses come in small groups, not in proportion to the count (a guess, not
verified: runs that land while another program's attach or detach rewrites
the tracepoint's callers).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jitterscope.collector.probes.irq import SOFTIRQ_NAMES, IrqProbe, irq_name
from jitterscope.workload import last_cpu

pytestmark = pytest.mark.bpf

PACKETS = 20_000

_TRAFFIC = f"""
import socket
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range({PACKETS}):
    tx.sendto(b"x" * 64, rx.getsockname())
    rx.recv(64)
"""


def softirqs() -> dict[tuple[int, str], int]:
    lines = open("/proc/softirqs").read().splitlines()[1:]
    return {(cpu, name.rstrip(":")): int(n)
            for name, *counts in map(str.split, lines) for cpu, n in enumerate(counts)}


def interrupts() -> dict[tuple[int, int], int]:
    lines = open("/proc/interrupts").read().splitlines()
    ncpu = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        head, *rest = line.split()
        if head.rstrip(":").isdigit():
            for cpu, n in enumerate(rest[:ncpu]):
                out[(cpu, int(head.rstrip(":")))] = int(n)
    return out


def missed(kernel_count: int) -> int:
    """Runs a shared machine may hide from the probe (see the module's doc)."""
    return max(2, kernel_count // 20)


def snapshot():
    return softirqs(), interrupts()


def activity(tmp_path, cpu: int) -> None:
    subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", _TRAFFIC], check=True, timeout=120)
    with open(tmp_path / "sync", "wb") as f:
        for _ in range(30):
            f.write(os.urandom(4096))
            f.flush()
            os.fsync(f.fileno())


def test_sums_match_the_kernels_counters(tmp_path):
    cpu = last_cpu()  # tests keep themselves off it
    with IrqProbe() as probe:
        outer_before = snapshot()
        probe.read()
        inner_before = snapshot()
        activity(tmp_path, cpu)
        inner_after = snapshot()
        got = probe.read()
        outer_after = snapshot()
        assert probe.map_full_drops() == 0

    def bounds(i: int, key) -> tuple[int, int]:
        return (inner_after[i].get(key, 0) - inner_before[i].get(key, 0),
                outer_after[i].get(key, 0) - outer_before[i].get(key, 0))

    checked = 0
    for vec, name in enumerate(SOFTIRQ_NAMES):
        for c in range(os.cpu_count()):
            lo, hi = bounds(0, (c, name))
            count = got.get(("softirq", c, vec))
            assert lo - 1 - missed(lo) <= (count.count if count else 0) <= hi + 1, (name, c, lo, hi, count)
            checked += lo > 0
    net_rx = got[("softirq", cpu, SOFTIRQ_NAMES.index("NET_RX"))]
    assert bounds(0, (cpu, "NET_RX"))[0] >= PACKETS // 10, "the traffic made NET_RX softirqs on its CPU"
    assert net_rx.time_ns > 0 and checked >= 3

    # the hard IRQ that fired most in the window (the disk's, on this host)
    hard = max(inner_after[1], key=lambda k: inner_after[1][k] - inner_before[1].get(k, 0))
    lo, hi = bounds(1, hard)
    assert lo > 0, "the fsync'd writes made hard IRQs"
    sums = got[("hardirq", *hard)]
    assert lo - 1 - missed(lo) <= sums.count <= hi + 1, (hard, lo, hi, sums)
    assert sums.time_ns > 0
    assert irq_name(hard[1]), "a numbered IRQ has its handler's name under /proc/irq/N"
    # time is a duration per run: the hard IRQ's mean stays far below a millisecond
    assert sums.time_ns / sums.count < 1_000_000
