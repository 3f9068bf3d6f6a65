# SPDX-License-Identifier: Apache-2.0
"""jitterscope benchmarks. Ratios against a baseline measured in the same
process, because these machines are shared and noisy.

    .venv/bin/python bench/run.py [decode] [pipeline] [probe] [storm] [alert-delay] ...   (default: all)

Prints a Markdown section per benchmark; bench/RESULTS.md keeps the recorded
runs with the command that produced them.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitterscope.schemas import batches, events, topics  # noqa: E402


def synthetic_runq(host: str, n: int, start_seq: int = 0) -> list[events.RunqEvent]:
    now = time.time_ns()
    return [events.RunqEvent(host=host, boot_id="bench", seq=start_seq + i, ts_ns=now + i, pid=1000 + i % 50,
                             tid=2000 + i % 200, comm="vllm-worker", cpu=i % 64, wait_ns=5_000_000 + i,
                             suspect_pid=300, suspect_tid=301, suspect_comm="logrotate") for i in range(n)]


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_decode() -> str:
    """Batch decode (one msgspec call) vs the naive per-line json.loads."""
    records = synthetic_runq("bench", 500)
    payload = batches.encode_batch(records)
    messages = [payload] * 200  # 100k events
    decoder = batches.BatchDecoder(events.RunqEvent)
    ours = best_of(lambda: [decoder.decode(m) for m in messages])
    naive = best_of(lambda: [[json.loads(l) for l in m.splitlines()] for m in messages])
    n = 500 * len(messages)
    return (f"| decode 100k runq events, 500/message | {n / ours:,.0f} events/s | per-line json.loads "
            f"{n / naive:,.0f} events/s | {naive / ours:.1f}x faster |")


class StreamsWorker:
    """A real streams worker over the embedded broker, for the pipeline benches."""

    def __init__(self, tree: Path | None = None, **settings: str):
        """``tree``: run the worker from this source tree (bench/mix.py's
        same-run baseline) instead of the installed one."""
        self.settings = settings
        self.tree = tree

    def __enter__(self) -> "StreamsWorker":
        from confluent_kafka import Producer

        from jitterscope.broker import EmbeddedBroker, free_port
        from jitterscope.query import running_worker
        from jitterscope.common.settings import load

        self._broker = EmbeddedBroker().start()
        self._data = tempfile.TemporaryDirectory()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env.update(JITTERSCOPE_BOOTSTRAP_SERVERS=self._broker.bootstrap_servers, JITTERSCOPE_DATA_DIR=self._data.name,
                   JITTERSCOPE_STREAMS_WEB_PORT=str(free_port()), JITTERSCOPE_KAFKA_SESSION_TIMEOUT_S="6",
                   **{f"JITTERSCOPE_{k.upper()}": v for k, v in self.settings.items()})
        if self.tree:  # before site-packages, so it wins over the editable install
            env["PYTHONPATH"] = str(self.tree)
        # cwd: not the repository root, whose jitterscope/ would come first on sys.path and hide ``tree``
        self.proc = subprocess.Popen([sys.executable, "-m", "jitterscope.cli", "streams"], env=env, cwd=self._data.name,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._settings = load(data_dir=Path(self._data.name))
        self._running_worker = running_worker
        deadline = time.monotonic() + 90
        while True:
            try:
                self.count()
                break
            except Exception:
                assert time.monotonic() < deadline, "worker did not start"
                time.sleep(0.3)
        self.producer = Producer({"bootstrap.servers": self._broker.bootstrap_servers, "compression.type": "lz4",
                                  "linger.ms": 5, "acks": "all"})
        # warm-up: one batch through, so the group has joined
        self.producer.produce(topics.RUNQ, batches.encode_batch(synthetic_runq("warm", 10)), key=b"warm")
        self.producer.flush(10)
        while self.count() < 10:
            time.sleep(0.2)
        return self

    def count(self) -> int:
        from jitterscope.query import query_worker

        worker = self._running_worker(self._settings)
        return query_worker(worker, "SELECT count() FROM jitterscope.runq_events", {})[1][0][0]

    def rss_mb(self) -> float:
        return _cpu_and_rss(self.proc.pid)[1]

    def send_and_wait(self, hosts: int, n: int) -> tuple[float, float]:
        """Produce n runq events over ``hosts`` hosts; (seconds to produce, seconds until stored)."""
        before = self.count()
        batches = [batches.encode_batch(synthetic_runq(f"h{h}", 500, start_seq=s))
                   for h in range(hosts) for s in range(0, n // hosts, 500)]
        t0 = time.perf_counter()
        for i, payload in enumerate(batches):
            self.producer.produce(topics.RUNQ, payload, key=f"h{i % hosts}".encode())
            self.producer.poll(0)
        self.producer.flush(60)
        produced = time.perf_counter() - t0
        while self.count() < before + n:
            time.sleep(0.1)
        return produced, time.perf_counter() - t0

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._broker.stop()
        self._data.cleanup()


def bench_pipeline(n: int = 200_000) -> str:
    """Events/s one streams worker carries from Kafka into ClickHouse."""
    with StreamsWorker(runq_alert_ms="1000000") as worker:  # measure the storage path, not alerting
        produced, stored = worker.send_and_wait(8, n)
    return (f"| {n:,} runq events produced (500/message, lz4) → 1 Faust worker → chDB | "
            f"{n / stored:,.0f} events/s stored | producer alone {n / produced:,.0f} events/s | "
            f"worker at {produced / stored:.2f}x the producer's rate |")


def bench_storm_memory(n: int = 1_000_000) -> str:
    """Worker RSS after a one-host storm: evidence bounded by count (the
    default) vs bounded by time only (the horizon), same run."""
    rss = {}
    for name, bound in (("bounded", None), ("time only", str(10**9))):
        settings = {"evidence_max_events": bound} if bound else {}
        with StreamsWorker(runq_alert_ms="1000000", **settings) as worker:
            idle = worker.rss_mb()
            worker.send_and_wait(1, n)
            rss[name] = (idle, worker.rss_mb())
    (idle, bounded), (_, unbounded) = rss["bounded"], rss["time only"]
    return (f"| worker RSS after a {n:,}-event one-host storm, evidence bounded by count (200k/host) | "
            f"{bounded:,.0f} MB (idle {idle:,.0f} MB) | bounded by time only {unbounded:,.0f} MB | "
            f"{bounded / unbounded:.2f}x |")


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


# What the C loads below share: ``main(argc, argv)`` pins itself to the CPU in argv[2].
PINNED_C_MAIN = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(argv[2]), &set);
    sched_setaffinity(0, sizeof(set), &set);
"""

PING_PONG_C = r"""
/* Two processes on one CPU bounce a byte over two pipes: every round trip is
 * two wakeups and two context switches, nothing else. Prints round trips/s. */
""" + PINNED_C_MAIN + r"""
    long rounds = atol(argv[1]);
    int a[2], b[2];
    char c = 'x';
    if (pipe(a) || pipe(b))
        return 1;
    if (fork() == 0) {
        while (read(a[0], &c, 1) == 1 && c != 'q')
            write(b[1], &c, 1);
        return 0;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < rounds; i++) {
        write(a[1], &c, 1);
        read(b[0], &c, 1);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    c = 'q';
    write(a[1], &c, 1);
    wait(NULL);
    printf("%.0f\n", rounds / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9));
    return 0;
}
"""


def c_binary(directory: Path, name: str, text: str) -> Path:
    binary, source = directory / name, directory / f"{name}.c"
    source.write_text(text)
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(source)], check=True)
    return binary


def c_ping_pong_binary(directory: Path) -> Path:
    return c_binary(directory, "pingpong", PING_PONG_C)


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


def _cpu_and_rss(pid: int) -> tuple[float, float]:
    """(CPU seconds, user+sys of every thread; RSS in MB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    return cpu_s, rss_kb / 1024


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


class PeerTool:
    """A libbpf-tools program (runqslower, runqlat) running until closed;
    started once it says it is tracing (it prints that after attaching)."""

    def __init__(self, *argv: str):
        self.out = tempfile.NamedTemporaryFile("w+b")
        self.proc = subprocess.Popen(["stdbuf", "-oL", *argv], stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while b"Tracing" not in Path(self.out.name).read_bytes():
            assert self.proc.poll() is None and time.monotonic() < deadline, f"{argv[0]} did not start"
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.out.close()


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


def _git_show(rev: str, path: str) -> bytes:
    """A file of this repository as committed at ``rev``."""
    return subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, check=True).stdout


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


def _bpf_ns_per_switch(before: dict, after: dict) -> float:
    """BPF run time of one tool's programs per context switch between two
    scan_programs readings. The switch count is the run count of its busiest
    program: every tool here hooks sched_switch, which fires at least as
    often as the wakeups (names of other processes' programs are not
    readable from here)."""
    ran = {pid: (st.run_ns - before[pid].run_ns if pid in before else st.run_ns,
                 st.run_count - before[pid].run_count if pid in before else st.run_count, st.name)
           for pid, st in after.items()}
    switches = max((cnt for _ns, cnt, _name in ran.values()), default=0)
    return sum(ns for ns, _cnt, _name in ran.values()) / switches if switches else float("nan")


def storm_costs(setups: dict, binary: Path, rounds: int, cpu: int, repeats: int) -> tuple[dict, dict, list, dict]:
    """Each setup (name -> a factory of something loaded, with close()) in
    turn, ``repeats`` rounds: the C ping-pong storm's (``binary``, ``rounds``
    on ``cpu``, best of 3 runs) lost throughput against the best unloaded
    run of the same round, the kernel's BPF time per switch of what the
    setup loaded, and the ping-pong's own CPU time per round trip over the
    unloaded run's. The CPU time is the steadier measure on a VM: the
    kernel leaves out of it what the host steals from the vCPU
    (PARAVIRT_TIME_ACCOUNTING), which throughput pays; it holds the BPF
    programs and their tracepoint glue, run in the ping-pong's context,
    not other processes taking its CPU. Returns ({name: [loss per round]},
    {name: [ns per switch per round]}, [unloaded rate per round], {name:
    [extra CPU ns per round trip per round]})."""
    import resource

    from jitterscope.collector.selfcost import scan_programs

    def best() -> tuple[float, float]:
        """(round trips/s, CPU ns per round trip) of the fastest of 3 runs."""
        runs = []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            rate = float(subprocess.run([str(binary), str(rounds), str(cpu)], capture_output=True, check=True,
                                        text=True).stdout)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            runs.append((rate, cpu_s * 1e9 / rounds))
        return max(runs)

    def programs(loaded) -> dict:
        if isinstance(loaded, PeerTool) or hasattr(loaded, "bpf_pid"):
            return scan_programs(Path(f"/proc/{getattr(loaded, 'bpf_pid', None) or loaded.proc.pid}/fdinfo"))
        fds = loaded.program_fds() if hasattr(loaded, "program_fds") else loaded.probe.program_fds()
        return scan_programs(names={fd: name for name, fd in fds.items()})

    cost: dict[str, list[float]] = {name: [] for name in setups}
    per_switch: dict[str, list[float]] = {name: [] for name in setups}
    cpu_extra: dict[str, list[float]] = {name: [] for name in setups}
    bases = []
    for _ in range(repeats):
        base, runs = [best()], {}
        for name, setup in setups.items():
            loaded = setup()
            try:
                before = programs(loaded)
                runs[name] = best()
                per_switch[name].append(_bpf_ns_per_switch(before, programs(loaded)))
            finally:
                loaded.close()
            base.append(best())
        base_rate, base_cpu = max(base)
        bases.append(base_rate)
        for name, (rate, cpu_ns) in runs.items():
            cost[name].append(1 - rate / base_rate)
            cpu_extra[name].append(cpu_ns - base_cpu)
    return cost, per_switch, bases, cpu_extra


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
            f"our probe before one slot per thread ({PROBE_BEFORE}), stack capture off": lambda: ConsumedProbe(_head_runq_probe(Path(tmp))),
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


def bench_attribution(requests: int = 50_000) -> str:
    """Requests/s one worker's attribution step handles, on a busy host: 16
    serving processes, 20k run-queue events in the window (a heavily
    contended host), requests of ~50 ms. Baseline: the same requests against
    an empty evidence window (the fixed per-request cost)."""
    from jitterscope.streams.attribution import Attributor

    ms = 1_000_000
    t0 = time.time_ns()

    def spans():
        return [events.RequestSpan(host="h", boot_id="b", seq=i, ts_ns=t0 + i * ms, request_id=f"r{i}",
                                   trace_id="ab" * 16, span_id="cd" * 8, name="llm_request", pid=1000 + i % 16,
                                   start_ns=t0 + i * ms, end_ns=t0 + i * ms + 50 * ms, status="ok")
                for i in range(requests)]

    def run(with_evidence: bool) -> float:
        a = Attributor(horizon_ns=10**15)
        if with_evidence:
            for i in range(20_000):
                a.add_evidence(events.RunqEvent(
                    host="h", boot_id="b", seq=i, ts_ns=t0 + i * (requests * ms // 20_000) + 8 * ms,
                    pid=1000 + i % 16, tid=2000 + i % 64, comm="vllm", cpu=i % 64, wait_ns=8 * ms,
                    suspect_pid=300 + i % 5, suspect_tid=300, suspect_comm=f"job{i % 5}"))
        todo = spans()
        for s in todo:
            a.add_request(s)
        t = time.perf_counter()
        done = a.due(t0 + requests * ms + 10**12)
        elapsed = time.perf_counter() - t
        assert len(done) == requests
        return requests / elapsed

    busy, empty = run(True), run(False)
    return (f"| attribute {requests:,} requests (16 processes, 20k waits in the window) | {busy:,.0f} requests/s | "
            f"no evidence in the window {empty:,.0f} requests/s | {busy / empty:.2f}x |")


#: run-queue events in the `saved` bench's fleet: BENCH_RUNQ_EVENTS=100000000 for issue 13's goal
SAVED_EVENTS = int(os.environ.get("BENCH_RUNQ_EVENTS", 2_000_000))

#: noisy-neighbours as it was before the runq_minute rollup (migration 008): the same-run baseline
RAW_NOISY_NEIGHBOURS = """SELECT suspect_comm AS command, count() AS starvations, uniqExact(host) AS hosts,
       round(sum(wait_ns) / 1e9, 2) AS waited_s, round(max(wait_ns) / 1e6, 1) AS worst_ms
FROM jitterscope.runq_events FINAL
WHERE ts > now64(9) - toIntervalSecond({since:UInt32}) AND suspect_pid != 0 AND suspect_pid != pid
GROUP BY suspect_comm ORDER BY starvations DESC, command LIMIT {limit:UInt32}"""


def _stored_bytes(client, table: str) -> tuple[int, int, int]:
    """(rows, bytes on disk, uncompressed bytes) of a table's active parts."""
    return client.query("SELECT sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes) FROM system.parts "
                        "WHERE database = 'jitterscope' AND table = {t:String} AND active",
                        parameters={"t": table}).result_rows[0]


#: the ledger before per-block seq bitmaps (issue 13): the saved bench's ledger baseline
LEDGER_BEFORE = "7b2b8d9"


def _module_at(rev: str, path: str):
    """A module of this repository as committed at ``rev`` (imported from a copy)."""
    return _load_source(f"before_{Path(path).stem}", _git_show(rev, path).decode())


def _modules_at(rev: str, paths: list[str]) -> dict[str, object]:
    """Several streams modules of this repository as committed at ``rev``,
    imported from copies that import each other (not this tree's): a
    module's neighbours as they were, so a 'before' is the whole of it.
    Path -> module; imported in the order given (a module after those it
    imports)."""
    names = {path: f"before_{rev}_{Path(path).stem}" for path in paths}
    loaded = {}
    for path in paths:
        source = _git_show(rev, path).decode()
        for other, name in names.items():
            dotted = "jitterscope." + other.removesuffix(".py").replace("/", ".")
            source = re.sub(rf"\bfrom {re.escape(dotted)} import", f"from {name} import", source)
        loaded[path] = _load_source(names[path], source)
    return loaded


def _load_source(name: str, source: str):
    """A module from its source text, registered as ``name``."""
    import importlib.util

    copy = Path(tempfile.mkdtemp()) / f"{name}.py"
    copy.write_text(source)
    spec = importlib.util.spec_from_file_location(name, copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def bench_saved_queries() -> str:
    """Latency of each saved fleet query and of the whole capacity report over
    the synthetic fleet (300 hosts, SAVED_EVENTS run-queue events, 432k
    histogram rows, 200k attributions), best of 3 and worst of 3 after a warm-up,
    against noisy-neighbours' old raw-events FINAL scan in the same store; the
    ledger against the ledger as at LEDGER_BEFORE (asserting the same rows);
    the cost of the sink's key look-up on runq_events (what keeps runq_minute
    exact); and the bytes each stored row takes, per table."""
    import msgspec

    from jitterscope.reports import capacity, queries, synthetic
    from jitterscope.streams import clickhouse, sink

    n = SAVED_EVENTS
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as data:
        client = clickhouse.connect(None, Path(data))
        clickhouse.migrate(client)
        started = time.perf_counter()
        synthetic.load_fleet(client, runq_events=n, progress=lambda i, k: print(
            f"  loading {i}/{k} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True))
        loaded = time.perf_counter() - started
        for table in ("runq_events", "runq_minute"):
            client.command(f"OPTIMIZE TABLE jitterscope.{table} FINAL")

        def timed(fn) -> tuple[float, float]:
            fn()  # warm-up: the first run reads from disk into the page cache
            runs = [best_of(fn, 1) for _ in range(3)]
            return min(runs), max(runs)

        params = {"since": "604800", "limit": "20"}
        raw, raw_worst = timed(lambda: client.query(RAW_NOISY_NEIGHBOURS, parameters=params))
        base = f"old noisy-neighbours (raw events FINAL) {raw * 1000:,.0f} ms (worst {raw_worst * 1000:,.0f})"
        lines = [f"| synthetic fleet load: {n:,} runq events | {loaded:.0f} s | | |"]
        for name in queries.SAVED:
            sql, params = queries.bind(name, {})
            took, worst = timed(lambda: client.query(sql, parameters=params))
            lines.append(f"| saved query `{name}` at {n:,} events | {took * 1000:,.0f} ms (worst {worst * 1000:,.0f}) "
                         f"| {base} | {took / raw:.3f}x |")
        # the ledger as it was (every stored seq sorted): the same rows, in how long
        ledger_sql, ledger_params = queries.bind("ledger", {"limit": "1000000"})  # every row compared
        before_sql = _module_at(LEDGER_BEFORE, "reports/ledger.py").sql()
        rows = client.query(ledger_sql, parameters=ledger_params).result_rows
        assert rows == client.query(before_sql, parameters=ledger_params).result_rows, "the ledgers disagree"
        new_took, _ = timed(lambda: client.query(ledger_sql, parameters=ledger_params))
        old_took, old_worst = timed(lambda: client.query(before_sql, parameters=ledger_params))
        lines.append(f"| saved query `ledger`, all {len(rows)} host/boot rows, the same as before's | "
                     f"{new_took * 1000:,.0f} ms | the ledger as at {LEDGER_BEFORE} (every seq sorted) "
                     f"{old_took * 1000:,.0f} ms (worst {old_worst * 1000:,.0f}) | {new_took / old_took:.4f}x |")
        ctx = capacity.Context(lambda sql, p: client.query(sql, parameters=p).result_rows, 7 * 86400, None)
        took, worst = timed(lambda: capacity.build(ctx))
        lines.append(f"| `report` (every section) at {n:,} events | {took * 1000:,.0f} ms (worst {worst * 1000:,.0f}) "
                     f"| {base} | {took / raw:.2f}x |")
        batch = synthetic_runq(synthetic.WORST_RUNQ_HOST, 500)
        newest = client.query("SELECT toUnixTimestamp64Nano(max(ts)) FROM jitterscope.runq_events").result_rows[0][0]
        batch = [msgspec.structs.replace(r, ts_ns=newest - 1_000_000_000 + i * 1_000_000, seq=10**9 + i)
                 for i, r in enumerate(batch)]  # a batch at the stored end of a host: the look-up's real case
        look, look_worst = timed(lambda: sink.stored_keys(client, "runq_events", batch))
        store, _ = timed(lambda: clickhouse.insert_records(client, "runq_events", batch))
        lines.append(f"| sink key look-up on runq_events (500-event batch, {n:,} stored) | {look * 1000:.1f} ms "
                     f"(worst {look_worst * 1000:.1f}) | the batch's insert {store * 1000:.1f} ms | "
                     f"{look / store:.2f}x |")
        for table in ("runq_events", "runq_minute", "latency_histograms", "latency_minute", "request_attribution"):
            rows, on_disk, unpacked = _stored_bytes(client, table)
            lines.append(f"| bytes per stored {table} row | {on_disk / rows:.1f} B on disk ({rows:,} rows) | "
                         f"uncompressed {unpacked / rows:.1f} B | {unpacked / on_disk:.1f}x compression |")
        client.close()
    return "\n".join(lines)


#: runq_events' columns and types (schemas/clickhouse/001 + 007); codecs vary per storage variant
RUNQ_COLUMNS = {"host": "LowCardinality(String)", "boot_id": "LowCardinality(String)", "seq": "UInt64",
                "ts": "DateTime64(9)", "pid": "UInt32", "tid": "UInt32", "comm": "LowCardinality(String)",
                "cpu": "UInt16", "wait_ns": "UInt64", "suspect_pid": "UInt32", "suspect_tid": "UInt32",
                "suspect_comm": "LowCardinality(String)", "victim_stack": "UInt64", "suspect_stack": "UInt64"}
AS_STORED = {"ts": "Delta, ZSTD(1)", "wait_ns": "T64, ZSTD(1)", "victim_stack": "T64, ZSTD(1)",
             "suspect_stack": "T64, ZSTD(1)"}
#: every column compressed: small integers T64 (drops unused high bits), counters and times by delta
#: (Gorilla is refused on integer columns: a floating-point codec)
PACKED = {c: "ZSTD(1)" for c in RUNQ_COLUMNS} | {
    "seq": "Delta, ZSTD(1)", "ts": "DoubleDelta, ZSTD(1)", "pid": "T64, ZSTD(1)", "tid": "T64, ZSTD(1)",
    "cpu": "T64, ZSTD(1)", "wait_ns": "T64, ZSTD(1)", "suspect_pid": "T64, ZSTD(1)", "suspect_tid": "T64, ZSTD(1)",
    "victim_stack": "T64, ZSTD(1)", "suspect_stack": "T64, ZSTD(1)"}
KEY = "host, ts, boot_id, seq"
#: migration 015's contract, as the sink applies it (streams/clickhouse.py MICROSECOND_FIELDS)
MICROSECONDS = {"ts": "fromUnixTimestamp64Nano(intDiv(toUnixTimestamp64Nano(runq_events.ts), 1000) * 1000)",
                "wait_ns": "intDiv(runq_events.wait_ns, 1000) * 1000"}
STORAGE_VARIANTS = {  # name -> (codec per column, sort key[, column -> stored expression])
    "as stored (001/007)": (AS_STORED, KEY),
    "all columns ZSTD(1), ts DoubleDelta": (PACKED, KEY),
    "same, ts Delta (applied in 008)": (PACKED | {"ts": "Delta, ZSTD(1)"}, KEY),
    "same, ts Delta (as 008), small integers ZSTD(1) without T64": (
        PACKED | {"ts": "Delta, ZSTD(1)"} | {c: "ZSTD(1)" for c in ("pid", "tid", "cpu", "suspect_pid", "suspect_tid")},
        KEY),
    "same, ts Delta, wait_ns ZSTD(3)": (PACKED | {"ts": "Delta, ZSTD(1)", "wait_ns": "T64, ZSTD(3)"}, KEY),
    "same, ts DoubleDelta, ZSTD(3)": ({c: v.replace("ZSTD(1)", "ZSTD(3)") for c, v in PACKED.items()}, KEY),
    "same, wait_ns Delta": (PACKED | {"wait_ns": "Delta, ZSTD(1)"}, KEY),
    # not applied (a type change: DateTime64(6), wait in us): what the ns digits below a microsecond cost. The
    # columns hold the us counts themselves, as such columns would (a multiple of 1000 in ns saves ~nothing)
    "as 008, ts and wait_ns stored in microseconds": (
        PACKED | {"ts": "Delta, ZSTD(1)"}, KEY,
        {"ts": "fromUnixTimestamp64Nano(toUnixTimestamp64Micro(runq_events.ts))",
         "wait_ns": "intDiv(runq_events.wait_ns, 1000)"}),
    # applied in 015: the columns stay ns (readers unchanged), the sink truncates to whole us, GCD divides it out
    "as 015: ts and wait_ns truncated to whole us in their ns columns, GCD codec": (
        PACKED | {"ts": "GCD, Delta, T64, ZSTD(1)", "wait_ns": "GCD, T64, ZSTD(1)"}, KEY, MICROSECONDS),
    "same, ts GCD, Delta, ZSTD(1) (no T64)": (
        PACKED | {"ts": "GCD, Delta, ZSTD(1)", "wait_ns": "GCD, T64, ZSTD(1)"}, KEY, MICROSECONDS),
    "same, truncated to whole us without GCD": (PACKED | {"ts": "Delta, ZSTD(1)"}, KEY, MICROSECONDS),
    "ZSTD(1) + DoubleDelta, key (host, tid, ts)": (PACKED, "host, tid, ts, boot_id, seq"),
    "ZSTD(1) + DoubleDelta, key (host, comm, tid, ts)": (PACKED, "host, comm, tid, ts, boot_id, seq"),
}
STORAGE_EVENTS = int(os.environ.get("BENCH_STORAGE_EVENTS", 5_000_000))


def bench_storage() -> str:
    """Bytes per stored run-queue event under each codec/sort-key variant, over
    the synthetic fleet's run-queue events (per-host time order and seq, ns
    times, as a collector sends them; 300 hosts at the per-host rate of 100M events a
    day), each variant fully merged; and the columns that cost most in each."""
    from jitterscope.reports import synthetic
    from jitterscope.streams import clickhouse

    n = STORAGE_EVENTS
    lines = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as data:
        client = clickhouse.connect(None, Path(data))
        clickhouse.migrate(client)
        # as dense per host as a 100M-event day over 300 hosts: time deltas shrink with density
        # at ns, as the collector sends them: the variants before 015 stored them so
        for sql in synthetic.runq_statements(300, n, max(60, 86400 * n // 100_000_000), time.time_ns(), 1):
            client.command(sql, parameters={"suspects": synthetic.SUSPECTS})
        for i, (name, (codecs, key, *rounded)) in enumerate(STORAGE_VARIANTS.items()):
            stored = rounded[0] if rounded else {}
            table = f"runq_variant_{i}"
            columns = ", ".join(f"{c} {t}" + (f" CODEC({codecs[c]})" if c in codecs else "")
                                for c, t in RUNQ_COLUMNS.items())
            client.command(f"CREATE TABLE jitterscope.{table} ({columns}) ENGINE = ReplacingMergeTree "
                           f"PARTITION BY toDate(ts) ORDER BY ({key})")
            client.command(f"INSERT INTO jitterscope.{table} SELECT "
                           f"{', '.join(stored.get(c, c) + f' AS {c}' for c in RUNQ_COLUMNS)} "
                           "FROM jitterscope.runq_events")
            client.command(f"OPTIMIZE TABLE jitterscope.{table} FINAL")
            rows, on_disk, _ = _stored_bytes(client, table)
            per_column = client.query(
                "SELECT name, sum(data_compressed_bytes) AS b FROM system.columns WHERE database = 'jitterscope' "
                "AND table = {t:String} GROUP BY name ORDER BY b DESC", parameters={"t": table}).result_rows
            top = ", ".join(f"{c} {b / rows:.2f}" for c, b in per_column[:4])
            lines.append(f"| runq_events {name}: ORDER BY ({key}) | {on_disk / rows:.2f} B/event on disk "
                         f"({rows:,} rows; largest columns B/event: {top}) | as stored first row | |")
        client.close()
    first = float(lines[0].split("| ")[2].split(" B")[0])
    return "\n".join(l.replace("| as stored first row | |", f"| as stored {first:.2f} B/event | "
                                f"{float(l.split('| ')[2].split(' B')[0]) / first:.2f}x |") for l in lines)


BENCHES = {"decode": bench_decode, "pipeline": bench_pipeline, "probe": bench_probe, "peers": bench_probe_peers,
           "attribution": bench_attribution, "hardware": bench_hardware_probes, "saved": bench_saved_queries, "storage": bench_storage,
           "storm": bench_storm_memory, "footprint": bench_collector_footprint, "pipeline-mix": lambda: __import__("mix").bench_pipeline_mix(),
           "sink-batch": lambda: __import__("mix").bench_sink_batch(),
           "store-path": lambda: __import__("store").bench_store_path(),
           "store-kafka": lambda: __import__("store").bench_store_kafka(),
           "attribution-mix": lambda: __import__("mix").bench_attribution_mix(),
           "phase-cost": lambda: __import__("vllm_mix").bench_phase_cost(),
           "alert-delay": lambda: __import__("alert_delay").bench_alert_delay(),
           "alert-delay-worker": lambda: __import__("alert_delay").bench_alert_delay_worker(),
           "alert-delay-steady": lambda: __import__("alert_delay").bench_alert_delay_steady(),
           "alert-delay-stages": lambda: __import__("alert_delay").bench_alert_delay_stages(),
           "alert-delay-collector": lambda: __import__("alert_delay").bench_alert_delay_collector(),
           "request-alert-delay": lambda: __import__("request_delay").bench_request_alert_delay(),
           "map-read": lambda: __import__("map_read").bench_map_read(),
           "vllm-cost": lambda: __import__("vllm_cost").bench_vllm_cost(),
           "glue": lambda: __import__("blocked").bench_tracepoint_glue(),
           "vllm-capacity": lambda: __import__("mix").bench_vllm_capacity(),
           "blocked": lambda: __import__("blocked").bench_blocked_overhead(),
           "gil": lambda: __import__("blocked").bench_gil_cost(),
           "gil-accounting": lambda: __import__("blocked").bench_gil_accounting(),
           "whole-up": lambda: __import__("overhead").bench_whole_up(),
           "syscall-tracepoints": lambda: __import__("overhead").bench_syscall_tracepoints(),
           "collector-slices": lambda: __import__("collector_slices").bench_collector_slices(),
           "collector-priority": lambda: __import__("collector_slices").bench_collector_priority()}


def main(names: list[str]) -> None:
    names = names or list(BENCHES)
    print(f"\n### {time.strftime('%Y-%m-%d %H:%M')} — {platform.node()}, {os.cpu_count()} CPUs, "
          f"kernel {platform.release()}\n")
    print(f"`.venv/bin/python bench/run.py {' '.join(names)}`\n")
    print("| what | measured | baseline (same run) | ratio |\n|---|---|---|---|")
    for name in names:
        print(BENCHES[name](), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
