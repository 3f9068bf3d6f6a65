# SPDX-License-Identifier: Apache-2.0
"""What the blocked probe (bpf/blocked.bpf.c) costs.

1. The context-switch storm: a C pipe ping-pong pinned to one CPU, unloaded,
   beside libbpf-tools' runqslower (the peer), our run-queue probe, the
   blocked probe (watching nothing: what every other process on the host
   pays), and both together.
   Throughput lost against the best unloaded run of the same round, and the
   kernel's own count of BPF time per switch (kernel.bpf_stats_enabled).
2. GIL probing: a GIL-heavy Python program (two threads of pure Python on two
   CPUs, handing the GIL over every switch interval) timed with and without
   the uprobes on its GIL waits, interleaved.

    .venv/bin/python bench/run.py blocked gil
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from run import PeerTool, c_ping_pong_binary, storm_costs  # noqa: E402  (bench/ is on sys.path)


class Polled:
    """Probes whose ring buffers a thread reads, as the collector does."""

    def __init__(self, *probes):
        self.probes = probes
        self._stop = threading.Event()
        for probe in probes:
            probe.open(lambda _event: None)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for probe in self.probes:
                probe.poll(50)

    def program_fds(self) -> dict[str, int]:
        return {name: fd for probe in self.probes for name, fd in probe.program_fds().items()}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for probe in self.probes:
            probe.close()


def bench_blocked_overhead(rounds: int = 100_000, repeats: int = 3) -> str:
    from jitterscope.collector.probes.blocked import BlockedProbe
    from jitterscope.collector.probes.runq import RunqProbe
    from jitterscope.collector.selfcost import BpfStats

    assert Path("/usr/sbin/runqslower").exists(), "runqslower missing: apt-get install libbpf-tools"
    cpu = 0
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {cpu} or {cpu})  # readers off the storm's CPU
    with tempfile.TemporaryDirectory() as tmp, BpfStats():
        binary = c_ping_pong_binary(Path(tmp))
        setups = {
            "runqslower 5000": lambda: PeerTool("/usr/sbin/runqslower", "5000"),
            "our run-queue probe": lambda: Polled(RunqProbe(5_000_000, None)),
            "the blocked probe, nothing watched": lambda: Polled(BlockedProbe(1_000_000)),
            "run-queue + blocked probes": lambda: Polled(RunqProbe(5_000_000, None), BlockedProbe(1_000_000)),
        }

        cost, per_switch, bases = storm_costs(setups, binary, rounds, cpu, repeats)
    med = {name: statistics.median(v) for name, v in cost.items()}
    ns = {name: statistics.median(v) for name, v in per_switch.items()}
    peer = "runqslower 5000"
    return "\n".join(
        f"| C pipe ping-pong on CPU {cpu}, {name} | {med[name]:.1%} throughput lost (median of {repeats}, range "
        f"{min(cost[name]):.1%}..{max(cost[name]):.1%}); BPF {ns[name]:,.0f} ns per switch | unloaded median "
        f"{statistics.median(bases):,.0f} round trips/s | {med[name] / med[peer]:.2f}x runqslower's loss; "
        f"{ns[name] / ns[peer]:.2f}x its BPF time |" for name in setups)


GIL_HEAVY = r"""
import os, sys, threading, time
def spin(n):
    x = 0
    for _ in range(n):
        x += 1
print(os.getpid(), flush=True)
sys.stdin.readline()
for _ in range(int(sys.argv[1])):
    threads = [threading.Thread(target=spin, args=(3_000_000,)) for _ in range(2)]
    start = time.process_time()  # CPU time, the probe's handlers included: steadier than wall time here
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(time.process_time() - start, flush=True)
"""


def _time_gil_heavy(runs: int, cpu: int, probed: bool) -> tuple[float, int]:
    """The GIL-heavy program's best run (CPU seconds, user and system: the
    probe's programs run in its context and are charged to it), with its GIL
    waits probed or not, and how many GIL waits the probe reported."""
    from jitterscope.collector import pyruntime
    from jitterscope.collector.probes.blocked import BlockedProbe

    child = subprocess.Popen([sys.executable, "-c", GIL_HEAVY, str(runs)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    pid = int(child.stdout.readline())
    probe, events = None, []
    try:
        if probed:
            site = pyruntime.locate(pid)
            assert isinstance(site, pyruntime.GilSite), site
            probe = BlockedProbe(1_000_000)
            probe.open(events.append)
            probe.set_watched({pid})
            probe.watch_gil(site)
        child.stdin.write("go\n")
        child.stdin.flush()
        best = min(float(child.stdout.readline()) for _ in range(runs))
        child.wait()
        if probe:
            probe.poll(0)
    finally:
        if probe:
            probe.close()
    return best, sum(1 for e in events if e.kind == "gil")


def bench_gil_cost(runs: int = 5, pairs: int = 8) -> str:
    """Two pure-Python threads sharing one CPU (every switch interval a GIL
    hand-over, each a GIL wait the uprobes see; one CPU so that the other
    CPU's load does not decide the timing), its CPU time without the blocked probe
    and with it watching the program, GIL uprobes attached: ``pairs`` pairs,
    back to back in alternating order, the best of ``runs`` each; the
    median of the pairs' ratios."""
    cpu = max(os.sched_getaffinity(0))
    ratios, waits, plain, probed = [], 0, [], []
    for i in range(pairs):
        order = (False, True) if i % 2 else (True, False)
        got = {mode: _time_gil_heavy(runs, cpu, mode) for mode in order}
        ratios.append(got[True][0] / got[False][0])
        waits += got[True][1]
        plain.append(got[False][0])
        probed.append(got[True][0])
    return (f"| GIL-heavy Python (2 threads x 3M pure-Python steps on one CPU), the blocked probe watching it, GIL "
            f"uprobes attached | {statistics.median(probed) * 1000:.0f} ms of CPU ({waits:,} GIL waits of 1 ms or more "
            f"reported) | without {statistics.median(plain) * 1000:.0f} ms ({pairs} pairs, best of {runs} each, "
            f"alternating) | {statistics.median(ratios):.3f}x (pairs {min(ratios):.3f}..{max(ratios):.3f}) |")
