# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: a real Kafka-protocol broker (embedded Tansu), real
ClickHouse (chDB in a temp dir), and the product's own processes started the
way `jitterscope up` starts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jitterscope.broker import EmbeddedBroker, free_port
from jitterscope.query import query_worker, run_query, running_worker
from jitterscope.common.settings import load


@pytest.fixture(scope="session", autouse=True)
def written_back_first():
    """Every dirty page written back before the first test. On a fresh
    machine the suite starts right after the venv's install, whose writeback
    (a gigabyte) then ran beside the first BPF tests: a fresh-clone run lost
    one of ten timed sleeps, half the block I/O, and a wakeup's timing, all
    in its first minutes, and none warm."""
    os.sync()


@pytest.fixture(scope="session", autouse=True)
def keep_last_cpu_for_workloads():
    """Tests (and the collector/worker they start) stay off the last CPU, where
    the starvation workloads run, so the unloaded control run is really unloaded."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, set(cpus[:-1]))
    yield
    os.sched_setaffinity(0, set(cpus))


# -- a CPU of the test's own ---------------------------------------------------
#
# Affinity keeps the test's own processes off the last CPU, where the
# workloads run; nothing of ours can keep everyone else's off it. Moving every
# other process on the host into a cpuset without that CPU would (cset
# shield), but on a shared machine it would also move other people's test runs
# (whose own workloads then cannot pin themselves to it) and processes that
# are none of ours. So tests whose premise is a quiet CPU instead run in a cpu
# cgroup of maximal weight: while any of its tasks is runnable on a CPU, an
# outside CPU hog there gets ~1/256 of it (measured on the 2-core build
# machine with a busy-loop beside a jsvictim-like thread: 1 s of run-queue
# wait in 3 s, 35-80 ms in the cgroup). The rest is judged with the kernel's
# own counters (`RunDelay`): a wait the kernel says the victim had is not
# blamed on the code under test, and a test whose premise still did not hold
# skips, saying why.

CPU_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
OWN_CPU_PREFIX = "jitterscope-tests-"


def _cgroup_root() -> tuple[Path, str, str] | None:
    """(cpu hierarchy root, weight file, its maximum) where this kernel has one we may use."""
    if (CPU_CGROUP_V1 / "cpu.shares").exists():
        return CPU_CGROUP_V1, "cpu.shares", "262144"
    try:
        if "cpu" in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            return CGROUP_V2, "cpu.weight", "10000"
    except OSError:
        pass
    return None


def _own_cgroup(root: Path) -> Path:
    """This process's cgroup in the hierarchy at ``root`` (to go back to)."""
    v1 = root == CPU_CGROUP_V1
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if ("cpu" in controllers.split(",")) if v1 else controllers == "":
            return root / path.lstrip("/")
    return root


def _empty_into(group: Path, root: Path) -> None:
    for _ in range(10):  # tasks that fork while we move them
        pids = (group / "cgroup.procs").read_text().split()
        if not pids:
            return
        for pid in pids:
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:  # exited meanwhile
                pass


def remove_cgroup(group: Path, timeout_s: float = 10) -> None:
    """rmdir a test's cgroup once its killed members have finished exiting
    (EBUSY until then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _remove_stale(root: Path) -> None:
    """Groups of test runs that were killed before they could remove theirs."""
    for group in root.glob(OWN_CPU_PREFIX + "*"):
        if not Path(f"/proc/{group.name.removeprefix(OWN_CPU_PREFIX)}").exists():
            try:
                _empty_into(group, root)
                group.rmdir()
            except OSError:
                pass


@contextmanager
def own_cpu_weight():
    """Runs this test process -- and so everything it starts from now on --
    in a cpu cgroup of maximal weight (see above). Yields the group's path,
    or None where there is no cpu controller to use (not root, cgroup v2
    without it): tests then rely on `RunDelay` alone."""
    found = _cgroup_root() if os.geteuid() == 0 else None
    if found is None:
        yield None
        return
    root, weight_file, weight = found
    _remove_stale(root)
    home = _own_cgroup(root)
    group = root / f"{OWN_CPU_PREFIX}{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / weight_file).write_text(weight)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        yield None
        return
    try:
        yield group
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
        _empty_into(group, home)  # children the test left running
        try:
            group.rmdir()
        except OSError:
            pass


@pytest.fixture(scope="module")
def own_cpu():
    """`own_cpu_weight` for a test module: request it before `broker` and
    `stack` (or autouse it) so that the pipeline starts inside it too."""
    with own_cpu_weight() as group:
        yield group


def exited_run_delay_ns(popen: subprocess.Popen) -> int | None:
    """Waits for ``popen`` to exit without reaping it and returns the run
    delay of its main thread (a zombie keeps its schedstat), or None."""
    try:
        os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)
        return int(Path(f"/proc/{popen.pid}/schedstat").read_text().split()[1])
    except (OSError, ChildProcessError, IndexError, ValueError):
        return None


class RunDelay:
    """Samples the kernel's count of the time a process's threads spent
    runnable but waiting for a CPU (run delay: /proc/PID/task/*/schedstat
    field 2, CONFIG_SCHED_INFO) every ``interval_s`` in a thread, with the
    wall clock (epoch ns, as spans carry), so that the kernel's own count of a
    request's waits can be set beside what the pipeline attributed to it.
    ``during`` is an upper bound of the waits that ended by the next sample
    (the kernel counts a wait when it ends); a sample late by load only
    widens the span."""

    def __init__(self, pid: int, interval_s: float = 0.001):
        import threading

        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"run-delay-{pid}", daemon=True)

    def _run(self) -> None:
        last: dict[str, int] = {}  # per thread: one that ends keeps its count in the sum
        while not self._stop.is_set():
            try:
                tasks = os.listdir(f"/proc/{self.pid}/task")
            except OSError:  # the process is gone
                return
            for task in tasks:
                try:
                    last[task] = int(Path(f"/proc/{self.pid}/task/{task}/schedstat").read_text().split()[1])
                except (OSError, IndexError, ValueError):
                    pass  # a thread that just ended
            self.samples.append((time.time_ns(), sum(last.values())))
            time.sleep(self.interval_s)

    def __enter__(self) -> "RunDelay":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def during(self, start_ns: int, end_ns: int) -> int | None:
        """At most this much waiting happened in [start_ns, end_ns]; None
        when the samples do not bracket it."""
        import bisect

        times = [t for t, _ in self.samples]
        before = bisect.bisect_right(times, start_ns) - 1
        after = bisect.bisect_left(times, end_ns)
        if before < 0 or after >= len(times):
            return None
        return self.samples[after][1] - self.samples[before][1]


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker() as b:
        yield b


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


@dataclass
class Stack:
    """Environment for product processes under test, and helpers to start them."""

    broker: EmbeddedBroker
    data_dir: Path
    web_port: int
    env: dict = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, *args: str, **env: str) -> Proc:
        log = self.data_dir / f"{name}.log"
        popen = subprocess.Popen(
            [sys.executable, "-m", "jitterscope.cli", *args], env={**self.env, **env},
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_worker(self) -> Proc:
        return self.start_worker_with()

    def start_worker_with(self, **env: str) -> Proc:
        worker = self.spawn("streams", "streams", **env)
        wait_until(lambda: self.query_ok(), 90, f"streams worker answering on {self.web_port}", worker)
        return worker

    def start_collector(self, *args: str, **env: str) -> Proc:
        collector = self.spawn("collector", "collector", *args, **env)
        wait_until(lambda: "collector started" in collector.text(), 90, "collector start", collector)
        return collector

    def query(self, sql: str, **parameters) -> list[list]:
        settings = load(data_dir=self.data_dir)
        return run_query(settings, sql, {k: str(v) for k, v in parameters.items()})[1]

    def query_ok(self) -> bool:
        """The worker itself answers (never open the store from the test
        process: chDB admits one process per data directory)."""
        try:
            worker = running_worker(load(data_dir=self.data_dir))
            return bool(worker) and query_worker(worker, "SELECT 1", {})[1] == [[1]]
        except Exception:
            return False

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def as_sent_before(records: list, *added: str) -> list:
    """``records`` as a collector sent them before its record type gained
    the fields ``added`` (and a migration their columns): for inserting
    into a store migrated only that far."""
    import msgspec

    kind = type(records[0])
    old = msgspec.defstruct(kind.__name__, [(f, object) for f in kind.__struct_fields__ if f not in added])
    return [old(**{f: getattr(r, f) for f in old.__struct_fields__}) for r in records]


def late_evidence(stack: Stack) -> float:
    """The worker's count of kernel evidence that came after the requests it
    overlapped were attributed (their budgets miss it): for failure messages
    of tests whose grace a loaded box may outrun."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.web_port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("jitterscope_streams_late_evidence_total"))


def wait_until(predicate, timeout: float, what: str, proc: Proc | None = None, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}) waiting for {what}:\n{proc.text()[-3000:]}")
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f"\n{proc.name} log:\n{proc.text()[-3000:]}" if proc else ""))


def span_pipeline(stack, worker_env: dict[str, str] | None = None, **collector_env: str):
    """A worker and a collector for request attribution tests: the collector
    filters its targets on a name nothing has, so only the processes that
    send it spans are watched (serving processes become targets), on a free
    OTLP port, with histograms every second; the worker attributes a request
    1 s after its span ends. Either's settings can be overridden. Returns
    (stack, worker, collector, otlp_port)."""
    otlp_port = free_port()
    worker = stack.start_worker_with(**{"JITTERSCOPE_ATTRIBUTION_GRACE_S": "1", **(worker_env or {})})
    collector = stack.start_collector(**{
        "JITTERSCOPE_TARGET_COMMS": '["no-such-process"]', "JITTERSCOPE_OTLP_PORT": str(otlp_port),
        "JITTERSCOPE_HISTOGRAM_INTERVAL_S": "1", **collector_env})
    return stack, worker, collector, otlp_port


@pytest.fixture(scope="module")
def stack(broker, tmp_path_factory):
    s = make_stack(broker, tmp_path_factory.mktemp("jitterscope"))
    yield s
    s.stop_all()


def make_stack(broker, data_dir: Path) -> Stack:
    """A Stack with its own store and web port: several can share one broker."""
    web_port = free_port()
    env = dict(os.environ)
    env.pop("JITTERSCOPE_CONFIG", None)
    env.update({
        "JITTERSCOPE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "JITTERSCOPE_DATA_DIR": str(data_dir),
        "JITTERSCOPE_STREAMS_WEB_PORT": str(web_port),
        "JITTERSCOPE_KAFKA_SESSION_TIMEOUT_S": "6",
        "JITTERSCOPE_SINK_FLUSH_S": "0.3",
        "JITTERSCOPE_COLLECTOR_METRICS_PORT": "0",
        "JITTERSCOPE_OTLP_PORT": "0",
        "JITTERSCOPE_HOST": f"test-{os.getpid()}",
    })
    return Stack(broker, data_dir, web_port, env)


def json_lines(payload: bytes) -> list[dict]:
    return [json.loads(line) for line in payload.splitlines() if line.strip()]


def records_on_topic(bootstrap_servers: str, topic: str, record_type: type) -> list:
    """Every record on a topic, read from the beginning until nothing new
    comes for 5 s (the worker's sends may still be in flight)."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from jitterscope.schemas import batches

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"t-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        decoder, out, idle_until = batches.BatchDecoder(record_type), [], time.monotonic() + 5
        while time.monotonic() < idle_until:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            good, bad = decoder.decode(message.value())
            assert not bad, bad
            out += good
            idle_until = time.monotonic() + 5
        return out
    finally:
        consumer.close()
