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
from pathlib import Path

from common import PeerTool, c_ping_pong_binary, storm_costs  # noqa: E402  (bench/ is on sys.path)


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


class EmptyTracepoints:
    """BCC programs that return at once on the run-queue probe's
    tracepoints: what attaching through BCC costs per hit before any work.
    For a classic tracepoint the kernel copies the arguments into a perf
    record on each hit; a raw one (``raw``), like runqslower's tp_btf
    programs, is handed the arguments in place."""

    TRACEPOINTS = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new", "task:task_newtask",
                   "sched:sched_process_exit")

    def __init__(self, raw: bool = False):
        from bcc import BPF

        if raw:
            text = "".join(f"RAW_TRACEPOINT_PROBE({tp.split(':')[1]}) {{ return 0; }}\n" for tp in self.TRACEPOINTS)
        else:
            text = "".join(f"TRACEPOINT_PROBE({tp.replace(':', ', ')}) {{ return 0; }}\n" for tp in self.TRACEPOINTS)
        self._bpf = BPF(text=text)

    def program_fds(self) -> dict[str, int]:
        return {name.decode(errors="replace"): fn.fd for name, fn in self._bpf.funcs.items()}

    def close(self) -> None:
        self._bpf.cleanup()


def bench_tracepoint_glue(rounds: int = 100_000, repeats: int = 3) -> str:
    """runqslower against empty BCC programs on our tracepoints, and against our probe."""
    from jitterscope.collector.probes.runq import RunqProbe
    from jitterscope.collector.selfcost import BpfStats

    assert Path("/usr/sbin/runqslower").exists(), "runqslower missing: apt-get install libbpf-tools"
    cpu = 0
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {cpu} or {cpu})
    with tempfile.TemporaryDirectory() as tmp, BpfStats():
        binary = c_ping_pong_binary(Path(tmp))
        setups = {
            "runqslower 5000": lambda: PeerTool("/usr/sbin/runqslower", "5000"),
            "empty BCC programs on the run-queue probe's 5 classic tracepoints": EmptyTracepoints,
            "empty BCC programs on the same 5 as raw tracepoints": lambda: EmptyTracepoints(raw=True),
            "our run-queue probe": lambda: Polled(RunqProbe(5_000_000, None)),
        }
        costs = storm_costs(setups, binary, rounds, cpu, repeats)
    return rows_against_runqslower(costs, cpu, repeats)


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

        costs = storm_costs(setups, binary, rounds, cpu, repeats)
    return rows_against_runqslower(costs, cpu, repeats)


def rows_against_runqslower(costs: tuple[dict, dict, list, dict], cpu: int, repeats: int) -> str:
    """storm_costs' figures as result rows, each against "runqslower 5000"."""
    cost, per_switch, bases, cpu_extra = costs
    med = {name: statistics.median(v) for name, v in cost.items()}
    ns = {name: statistics.median(v) for name, v in per_switch.items()}
    peer = "runqslower 5000"

    def paired(figures: dict[str, list[float]], name: str) -> str:
        # each round's figure over runqslower's of the same round: a round's setups run minutes apart at
        # most, so pairing them takes out the drift between rounds that the medians of whole runs keep
        ratios = [mine / theirs for mine, theirs in zip(figures[name], figures[peer])]
        return f"paired by round: median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}..{max(ratios):.2f}x"

    return "\n".join(
        f"| C pipe ping-pong on CPU {cpu}, {name} | {med[name]:.1%} throughput lost (median of {repeats}, range "
        f"{min(cost[name]):.1%}..{max(cost[name]):.1%}); BPF {ns[name]:,.0f} ns per switch; the ping-pong's CPU "
        f"+{statistics.median(cpu_extra[name]):,.0f} ns per round trip (range {min(cpu_extra[name]):,.0f}.."
        f"{max(cpu_extra[name]):,.0f}) | unloaded median {statistics.median(bases):,.0f} round trips/s | "
        f"{med[name] / med[peer]:.2f}x runqslower's loss ({paired(cost, name)}); "
        f"{statistics.median(cpu_extra[name]) / statistics.median(cpu_extra[peer]):.2f}x its CPU per round trip "
        f"({paired(cpu_extra, name)}); {ns[name] / ns[peer]:.2f}x its BPF time |" for name in cost)


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


COND_WAIT_LOOP = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
/* ns per pthread_cond_timedwait that times out at once (an abstime in the
   past): the call the GIL uprobes sit on, without the GIL. */
int main(int argc, char **argv)
{
    long n = atol(argv[1]);
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    struct timespec past = {0, 0}, a, b;
    printf("ready\n");
    fflush(stdout);
    getchar();
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_mutex_lock(&m);
    for (long i = 0; i < n; i++)
        pthread_cond_timedwait(&c, &m, &past);
    pthread_mutex_unlock(&m);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""


def _uprobe_ns_per_call(directory: Path, calls: int = 200_000, runs: int = 5) -> float:
    """What the GIL uprobe pair adds to one pthread_cond_timedwait call (trap,
    return probe and the programs' early exit for a condition variable that
    is not a GIL): best of ``runs`` with the pair attached minus best without."""
    from jitterscope.collector.probes.blocked import BlockedProbe, gil_wait_addresses

    source, binary = directory / "condwait.c", directory / "condwait"
    source.write_text(COND_WAIT_LOOP)
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(binary), str(source)], check=True)
    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if "/libc.so" in line or "/libc-" in line)

    def one(probed: bool) -> float:
        proc = subprocess.Popen([str(binary), str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        probe = None
        try:
            if probed:
                probe = BlockedProbe(1_000_000)
                for addr in gil_wait_addresses(libc):
                    probe._bpf.attach_uprobe(name=libc.encode(), addr=addr, fn_name=b"gil_wait_enter", pid=proc.pid)
                    probe._bpf.attach_uretprobe(name=libc.encode(), addr=addr, fn_name=b"gil_wait_return", pid=proc.pid)
            out, _ = proc.communicate("go\n", timeout=300)
            return float(out)
        finally:
            if probe:
                probe.close()

    return min(one(True) for _ in range(runs)) - min(one(False) for _ in range(runs))


def bench_gil_accounting(runs: int = 3) -> str:
    """GIL probing's cost counted, not timed (the timed pairs of bench_gil_cost
    spread 0.8x..1.4x on this box): the GIL-heavy program's CPU time without
    the probe, against what the probe added inside it -- the kernel's own
    count of the blocked probe's BPF run time while it ran (every program:
    switch, wakeup and uprobe handlers; on any CPU, so an upper bound) plus
    its uprobe hits times the trap cost per hit measured on a C loop."""
    from jitterscope.collector import pyruntime
    from jitterscope.collector.probes.blocked import BlockedProbe
    from jitterscope.collector.selfcost import BpfStats, scan_programs

    cpu = max(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp, BpfStats():
        trap_ns = _uprobe_ns_per_call(Path(tmp))
        plain = _time_gil_heavy(runs, cpu, False)[0]
        child = subprocess.Popen([sys.executable, "-c", GIL_HEAVY, str(runs)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        pid = int(child.stdout.readline())
        site = pyruntime.locate(pid)
        assert isinstance(site, pyruntime.GilSite), site
        with BlockedProbe(1_000_000) as probe:
            probe.open(lambda _e: None)
            probe.set_watched({pid})
            probe.watch_gil(site)
            names = {fd: name for name, fd in probe.program_fds().items()}
            before = scan_programs(names=names)
            child.stdin.write("go\n")
            child.stdin.flush()
            probed = [float(child.stdout.readline()) for _ in range(runs)]
            child.wait()
            after = scan_programs(names=names)
    ran = {pid_: (st.name, st.run_ns - before[pid_].run_ns, st.run_count - before[pid_].run_count)
           for pid_, st in after.items() if pid_ in before}
    bpf_ns = sum(ns for _n, ns, _c in ran.values())
    hits = sum(count for name, _ns, count in ran.values() if "gil_wait_enter" in name)
    added = bpf_ns + hits * 2 * trap_ns  # entry and return probe: two traps per call
    return (f"| GIL-heavy Python (2 threads x 3M pure-Python steps on one CPU), {runs} runs, the blocked probe "
            f"watching it, GIL uprobes attached: what the probe added, counted | {added / 1e6:,.1f} ms = BPF "
            f"{bpf_ns / 1e6:,.1f} ms + {hits:,} uprobe hits x 2 x {trap_ns:,.0f} ns per trap (C loop, same run) | "
            f"the program's CPU time unprobed: best run {plain * 1000:.0f} ms x {runs} (probed runs: "
            f"{', '.join(f'{t * 1000:.0f}' for t in probed)} ms) | {added / (plain * runs * 1e9):.2%} added |")
