# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py probe`, `footprint`, `peers`, `hardware`: the probes' own
cost: a context switch with the run-queue probe loaded, the collector's
footprint against bcc's runqlat, the probe against libbpf-tools' peers under
a context-switch storm, and the hardware probes' per-call cost."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, PeerTool, _cpu_and_rss, _git_show, c_ping_pong_binary, storm_costs


def ping_pong(rounds: int) -> float:
    """Round trips/s between two processes over pipes: each one is 2 wakeups
    and 2+ context switches, the probe's hottest path."""
    code = ("import os,sys\nr,w=int(sys.argv[1]),int(sys.argv[2])\n"
            "while True:\n b=os.read(r,1)\n if not b or b==b'q': break\n os.write(w,b)\n")
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", code, str(a_r), str(b_w)], pass_fds=(a_r, b_w))
    t = time.perf_counter()
    for _ in range(rounds):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    elapsed = time.perf_counter() - t
    os.write(a_w, b"q")
    child.wait()
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    return rounds / elapsed


def bench_probe(rounds: int = 100_000) -> str:
    """Context-switch cost with the run-queue probe loaded (unfiltered), vs not."""
    from jitterscope.collector.probes.runq import RunqProbe

    os.sched_setaffinity(0, {0})  # both ends on one CPU: every round trip is a switch
    before = max(ping_pong(rounds) for _ in range(3))
    probe = RunqProbe(threshold_ns=5_000_000, target_pids=None)
    probe.open(lambda e: None)
    try:
        with_probe = max(ping_pong(rounds) for _ in range(3))
    finally:
        probe.close()
    after = max(ping_pong(rounds) for _ in range(3))
    baseline = max(before, after)
    per_switch_ns = (1 / with_probe - 1 / baseline) / 2 * 1e9
    return (f"| pipe ping-pong on one CPU, probe watching all processes | {with_probe:,.0f} round trips/s | "
            f"without probe {baseline:,.0f} round trips/s | {with_probe / baseline:.2f}x "
            f"(~{per_switch_ns:.0f} ns per switch) |")


PACED_WAKEUPS_C = r"""
/* `paced N PERIOD_US SECONDS CPU`: N processes pinned to CPU, each sleeping
 * PERIOD_US between wakeups, beside a busy loop on the same CPU: every wakeup
 * waits for the CPU, about N * 1e6 / PERIOD_US run-queue waits a second. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    int n = atoi(argv[1]);
    long period_us = atol(argv[2]);
    double seconds = atof(argv[3]), end = now() + seconds;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[4]), &set);
    sched_setaffinity(0, sizeof(set), &set);
    for (int i = 0; i <= n; i++) {
        if (fork() == 0) {
            if (i == n) {  /* the busy loop */
                while (now() < end)
                    ;
                return 0;
            }
            while (now() < end)
                usleep(period_us);
            return 0;
        }
    }
    while (wait(NULL) > 0)
        ;
    return 0;
}
"""


def bench_collector_footprint(seconds: float = 20.0, wakeups_per_s: int = 10_000) -> str:
    """The collector's RSS and CPU at idle and under ~``wakeups_per_s``
    run-queue events a second (paced wakeups beside a busy loop on one CPU,
    with a 1 us event threshold so each becomes an event), next to bcc's own
    runqlat tool (runqlat-bpfcc -P 1: per-process histograms every second,
    the same library) under the same load, in the same run. The collector
    runs with every default probe, publishing to an embedded broker."""
    from jitterscope.broker import EmbeddedBroker, free_port

    tool = "/usr/sbin/runqlat-bpfcc"
    assert Path(tool).exists(), f"{tool} missing: apt-get install bpfcc-tools"
    load_cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {load_cpu} or {load_cpu})
    procs, period_us = 10, 10 * 1_000_000 // wakeups_per_s

    def window(pid: int, paced: Path | None, events_read=None) -> dict:
        load = (subprocess.Popen([str(paced), str(procs), str(period_us), str(seconds + 2), str(load_cpu)])
                if paced else None)
        time.sleep(1)  # the load settles
        cpu0, _ = _cpu_and_rss(pid)
        read0, t0 = events_read() if events_read else 0, time.monotonic()
        time.sleep(seconds)
        cpu1, rss = _cpu_and_rss(pid)
        read1, elapsed = events_read() if events_read else 0, time.monotonic() - t0
        if load:
            load.wait()
        return {"cpu": (cpu1 - cpu0) / elapsed, "rss": rss, "events_per_s": (read1 - read0) / elapsed}

    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        paced = Path(tmp) / "paced"
        (Path(tmp) / "paced.c").write_text(PACED_WAKEUPS_C)
        subprocess.run(["gcc", "-O2", "-o", str(paced), str(Path(tmp) / "paced.c")], check=True)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env.update(JITTERSCOPE_BOOTSTRAP_SERVERS=broker.bootstrap_servers, JITTERSCOPE_DATA_DIR=tmp,
                   JITTERSCOPE_HOST="footprint", JITTERSCOPE_COLLECTOR_METRICS_PORT=str(port),
                   JITTERSCOPE_OTLP_PORT="0", JITTERSCOPE_RUNQ_THRESHOLD_MS="0.001")
        log = Path(tmp) / "collector.log"
        collector = subprocess.Popen([sys.executable, "-m", "jitterscope.cli", "collector"], env=env,
                                     stdout=open(log, "wb"), stderr=subprocess.STDOUT)

        def events_read() -> float:
            import urllib.request

            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            return sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith("jitterscope_collector_events_read_total{") and 'probe="runq"' in line)

        try:
            deadline = time.monotonic() + 120
            while b"collector started" not in log.read_bytes():
                assert collector.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
            ours = {"idle": window(collector.pid, None, events_read), "load": window(collector.pid, paced, events_read)}
        finally:
            collector.terminate()
            collector.wait(60)
        peer = PeerTool(tool, "-P", "1")
        try:
            theirs = {"idle": window(peer.proc.pid, None), "load": window(peer.proc.pid, paced)}
        finally:
            peer.close()
    rows = []
    for state in ("idle", "load"):
        o, t = ours[state], theirs[state]
        what = "idle" if state == "idle" else f"{o['events_per_s']:,.0f} run-queue events/s"
        rows.append(f"| collector (every default probe, to Kafka), {what} | RSS {o['rss']:,.0f} MB, CPU "
                    f"{o['cpu']:.1%} of one core | bcc runqlat-bpfcc -P 1, same load: RSS {t['rss']:,.0f} MB, "
                    f"CPU {t['cpu']:.1%} | RSS {o['rss'] / t['rss']:.2f}x |")
    return "\n".join(rows)


class ConsumedProbe:
    """A RunqProbe whose events are read (and their stacks resolved, as the
    collector does) by a thread, as runqslower reads its own."""

    def __init__(self, probe, stacks: bool = True):
        import threading

        from jitterscope.collector.probes.runq import RunqStacks

        self.probe = probe
        self._stop = threading.Event()
        if not stacks:  # HEAD's events carry no stack ids: taken, not decoded
            probe.decode = lambda _raw: None
        reader = RunqStacks(lambda *_stack: None) if stacks else None

        def on_event(raw) -> None:
            if reader:
                reader.of_event(raw, raw.pid)

        probe.open(on_event)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.probe.poll(100)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.probe.close()


#: the run-queue probe before one slot per thread (issue 13): the 'before' of the peers bench
PROBE_BEFORE = "b7ae3fd"


def _head_runq_probe(directory: Path, rev: str = PROBE_BEFORE):
    """The run-queue probe as committed at ``rev``: the 'before' of a probe change."""
    from bcc import BPF

    from jitterscope.collector.probes import base
    from jitterscope.collector.probes.runq import RunqProbe

    for name in ("runq.bpf.c", "runq.h"):
        (directory / name).write_bytes(_git_show(rev, f"bpf/{name}"))
    for name in ("common.h", "drops.h", "drops.bpf.inc"):
        (directory / name).write_bytes((REPO / "bpf" / name).read_bytes())
    probe = RunqProbe.__new__(RunqProbe)
    probe._bpf = BPF(text=base.spliced_source(directory / "runq.bpf.c").encode(), cflags=[f"-I{directory}"])
    probe.threshold_ns, probe.filtering, probe.stacks = 5_000_000, False, False
    probe.set_targets(set())  # an older config struct simply lacks the newer fields
    return probe


def bench_probe_peers(rounds: int = 100_000, repeats: int = 3) -> str:
    """A C pipe ping-pong pinned to one CPU (a pure context-switch storm)
    with nothing loaded, with our run-queue probe (as committed at
    PROBE_BEFORE, and as in this tree with stack capture on and off), and with libbpf-tools'
    runqslower (5 ms, our probe's event threshold) and runqlat, one after
    another, ``repeats`` times interleaved. Two measures: the storm's lost
    throughput (best of 3 runs each, against the best unloaded run of the
    same repeat: other load on this shared machine only ever slows a run),
    and the kernel's own count of BPF run time per context switch
    (kernel.bpf_stats_enabled), which CPU sharing does not skew."""
    import statistics

    from jitterscope.collector.probes.runq import RunqProbe
    from jitterscope.collector.selfcost import BpfStats

    for tool in ("/usr/sbin/runqslower", "/usr/sbin/runqlat"):
        assert Path(tool).exists(), f"{tool} missing: apt-get install libbpf-tools"
    cpu = 0
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {cpu} or {cpu})  # readers off the storm's CPU
    with tempfile.TemporaryDirectory() as tmp, BpfStats():
        binary = c_ping_pong_binary(Path(tmp))

        setups = {
            f"our probe before one slot per thread ({PROBE_BEFORE}), stack capture off":
                lambda: ConsumedProbe(_head_runq_probe(Path(tmp))),
            "our probe, stack capture off": lambda: ConsumedProbe(RunqProbe(5_000_000, None, stacks=False)),
            "our probe, stack capture on": lambda: ConsumedProbe(RunqProbe(5_000_000, None)),
            "runqslower 5000": lambda: PeerTool("/usr/sbin/runqslower", "5000"),
            "runqlat": lambda: PeerTool("/usr/sbin/runqlat"),
        }
        cost, per_switch, bases, _ = storm_costs(setups, binary, rounds, cpu, repeats)
    med = {name: statistics.median(v) for name, v in cost.items()}
    ns = {name: statistics.median(v) for name, v in per_switch.items()}
    dearer = max(("runqslower 5000", "runqlat"), key=lambda n: med[n])
    lines = []
    for name in setups:
        lines.append(
            f"| C pipe ping-pong on CPU {cpu}, {name} | {med[name]:.1%} throughput lost (median of {repeats}, "
            f"range {min(cost[name]):.1%}..{max(cost[name]):.1%}); BPF {ns[name]:,.0f} ns per switch "
            f"(range {min(per_switch[name]):,.0f}..{max(per_switch[name]):,.0f}) | unloaded median "
            f"{statistics.median(bases):,.0f} round trips/s | {med[name] / med[dearer]:.2f}x {dearer}'s loss; "
            f"{ns[name] / ns['runqslower 5000']:.2f}x runqslower's BPF time |")
    return "\n".join(lines)


def ioctl_loop(calls: int) -> float:
    """ioctl calls/s on an fd nobody watches: what every process on the host
    pays once the GPU ioctl probe attaches to the ioctl syscall tracepoints."""
    import fcntl
    import termios

    fd = os.open("/dev/null", os.O_RDONLY)
    t = time.perf_counter()
    for _ in range(calls):
        try:
            fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            pass
    elapsed = time.perf_counter() - t
    os.close(fd)
    return calls / elapsed


def bench_hardware_probes(rounds: int = 100_000) -> str:
    """All collector probes loaded (runq unfiltered, GPU ioctl, migrations,
    page placement, block I/O) vs none: context switches and ioctls."""
    from jitterscope.collector.probes.blockio import BlockIoProbe
    from jitterscope.collector.probes.gpu_ioctl import GpuIoctlProbe
    from jitterscope.collector.probes.migrate import MigrationProbe
    from jitterscope.collector.probes.pages import PageProbe
    from jitterscope.collector.probes.runq import RunqProbe
    from jitterscope.collector.topology import read_topology

    os.sched_setaffinity(0, {0})
    topo = read_topology()
    measure = lambda: (max(ping_pong(rounds) for _ in range(3)), max(ioctl_loop(rounds) for _ in range(3)))  # noqa: E731
    before = measure()
    probes = [RunqProbe(5_000_000), GpuIoctlProbe(50_000_000),
              MigrationProbe({c.cpu: c.node for c in topo["cpu_info"]}),
              PageProbe([(n.node, a, b) for n in topo["numa_nodes"] for a, b in n.pfn_ranges]), BlockIoProbe()]
    try:
        loaded = measure()
    finally:
        for probe in probes:
            probe.close()
    after = measure()
    switches = (loaded[0], max(before[0], after[0]))
    ioctls = (loaded[1], max(before[1], after[1]))
    return (f"| all probes loaded: pipe ping-pong / ioctl on an unwatched fd | {switches[0]:,.0f} round trips/s, "
            f"{ioctls[0]:,.0f} ioctls/s | none: {switches[1]:,.0f} round trips/s, {ioctls[1]:,.0f} ioctls/s | "
            f"{switches[0] / switches[1]:.2f}x, {ioctls[0] / ioctls[1]:.2f}x |")
