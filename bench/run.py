"""jitterscope benchmarks. Ratios against a baseline measured in the same
process, because these machines are shared and noisy.

    .venv/bin/python bench/run.py [decode] [pipeline] [probe] [storm] ...   (default: all)

Prints a Markdown section per benchmark; bench/RESULTS.md keeps the recorded
runs with the command that produced them.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jitterscope.schemas import events, topics  # noqa: E402


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
    payload = events.encode_batch(records)
    messages = [payload] * 200  # 100k events
    decoder = events.BatchDecoder(events.RunqEvent)
    ours = best_of(lambda: [decoder.decode(m) for m in messages])
    naive = best_of(lambda: [[json.loads(l) for l in m.splitlines()] for m in messages])
    n = 500 * len(messages)
    return (f"| decode 100k runq events, 500/message | {n / ours:,.0f} events/s | per-line json.loads "
            f"{n / naive:,.0f} events/s | {naive / ours:.1f}x faster |")


class StreamsWorker:
    """A real streams worker over the embedded broker, for the pipeline benches."""

    def __init__(self, **settings: str):
        self.settings = settings

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
        self.proc = subprocess.Popen([sys.executable, "-m", "jitterscope.cli", "streams"], env=env,
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
        self.producer.produce(topics.RUNQ, events.encode_batch(synthetic_runq("warm", 10)), key=b"warm")
        self.producer.flush(10)
        while self.count() < 10:
            time.sleep(0.2)
        return self

    def count(self) -> int:
        from jitterscope.query import query_worker

        worker = self._running_worker(self._settings)
        return query_worker(worker, "SELECT count() FROM jitterscope.runq_events", {})[1][0][0]

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(l for l in status.splitlines() if l.startswith("VmRSS:")).split()[1]) / 1024

    def send_and_wait(self, hosts: int, n: int) -> tuple[float, float]:
        """Produce n runq events over ``hosts`` hosts; (seconds to produce, seconds until stored)."""
        before = self.count()
        batches = [events.encode_batch(synthetic_runq(f"h{h}", 500, start_seq=s))
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


def bench_saved_queries() -> str:
    """Latency of each saved fleet query over the synthetic fleet (300 hosts,
    2M run-queue events, 108k histogram rows, 200k attributions), best of 3,
    against a plain count() of the biggest table in the same store; and the
    bytes each stored run-queue event takes on disk."""
    from jitterscope.reports import queries, synthetic
    from jitterscope.streams import clickhouse

    with tempfile.TemporaryDirectory() as data:
        client = clickhouse.connect(None, Path(data))
        clickhouse.migrate(client)
        synthetic.load_fleet(client)
        client.command("OPTIMIZE TABLE jitterscope.runq_events FINAL")
        baseline = best_of(lambda: client.query("SELECT count() FROM jitterscope.runq_events FINAL"), 3)
        lines = []
        for name in queries.SAVED:
            sql, params = queries.bind(name, {})
            took = best_of(lambda: client.query(sql, parameters=params), 3)
            lines.append(f"| saved query `{name}` | {took * 1000:.0f} ms | count() FINAL of 2M runq events "
                         f"{baseline * 1000:.0f} ms | {took / baseline:.1f}x |")
        rows, on_disk, raw = client.query(
            "SELECT sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes) FROM system.parts "
            "WHERE database = 'jitterscope' AND table = 'runq_events' AND active").result_rows[0]
        lines.append(f"| bytes per stored runq event | {on_disk / rows:.1f} B on disk ({rows:,} rows) | "
                     f"uncompressed {raw / rows:.1f} B | {raw / on_disk:.1f}x compression |")
        client.close()
    return "\n".join(lines)


BENCHES = {"decode": bench_decode, "pipeline": bench_pipeline, "probe": bench_probe,
           "attribution": bench_attribution, "hardware": bench_hardware_probes, "saved": bench_saved_queries,
           "storm": bench_storm_memory}


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
