# SPDX-License-Identifier: Apache-2.0
"""What the benches share: the repository (``REPO``, on sys.path), synthetic
run-queue events, a real streams worker over the embedded broker, the C
loads and their builds, a libbpf-tools peer, the context-switch storm's cost
per setup, and this repository's files and modules as committed at a
revision (the same-run baselines). bench/run.py only dispatches; each bench
lives in its own module and imports from here, never from run.py."""

from __future__ import annotations

import os
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


def _cpu_and_rss(pid: int) -> tuple[float, float]:
    """(CPU seconds, user+sys of every thread; RSS in MB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    return cpu_s, rss_kb / 1024


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


def _git_show(rev: str, path: str) -> bytes:
    """A file of this repository as committed at ``rev``."""
    return subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, check=True).stdout


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
