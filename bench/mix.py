# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py pipeline-mix`: one streams worker under a busy inference
host's mix, replayed at twice its rate, every rule on.

A busy 64-CPU inference host, per second (BUSY_HOST): run-queue waits over
the kernel threshold (1% of them over the 10 ms alarm, so the run-queue rule,
alert grouping and attribution all work), request spans (with
``request_slo_ms`` set, so the request rule judges every attribution),
histograms every 10 s for 200 targets, and the samplers as they really run:
interrupt time every 0.25 s per CPU and source, CFS throttling every 0.25 s
per quota cgroup. Enough such hosts are replayed at twice their rate to reach
the target rate.

Two measures, each against the same worker run from this tree with the
streams hot-path files as committed at MIX_BEFORE: the same-run baseline.
Rounds alternate the two (this machine is shared and noisy); the table
gives the median of the rounds and their range.

- capacity: the whole mix (``seconds`` of it) produced at once; events/s
  until every record is in chDB.
- alert delay: the mix produced paced, each record stamped with the moment
  it is sent; for every run-queue alert, its ``raised`` minus the event's
  end (``ts``): how long after the wait ended the worker judged it. p50/p99,
  and the events/s stored meanwhile. Once at one host's rate (what one
  worker here carries) and once at the target rate (beyond it: a backlog).

``BENCH_PROFILE=DIR`` also records the worker with py-spy during the
capacity phase (collapsed stacks and the top functions, into DIR).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path

from msgspec.structs import replace

from common import REPO, StreamsWorker, _git_show, _modules_at  # noqa: E402  (bench/ is on sys.path)

from jitterscope.schemas import batches, events, topics

#: records per second of one busy 64-CPU inference host
BUSY_HOST = {"runq": 20_000, "spans": 200, "irq": 64 * 2 * 4, "cfs": 32 * 4, "histograms": 200 * 2 / 10}
SPEEDUP = 2  # replayed at twice the host's rate
SERVING = list(range(1000, 1016))  # pids of one serving group (vLLM API server + engines)
OTHERS = list(range(2000, 2016))  # other watched processes (every victim is watched: it has a record)
SUSPECTS = [(300 + i, f"job{i}") for i in range(5)]
#: the worker's hot path before the judge ran ahead of the store (issue 13): the baseline's revision
MIX_BEFORE = "15e4fbd"
#: the attribution-mix bench's same-run baseline: attribution before per-phase answers and token objectives
#: (columnar, with stacked causes and wait-for chains). Before it: d485576, before attribution was columnar
#: (bench/RESULTS.md, 2026-12-04), whose attributions no longer compare field for field (causes, chains).
ATTRIBUTION_BEFORE = "3034472"
#: attribution's modules, each after those it imports: the baseline loads them all as at ATTRIBUTION_BEFORE
ATTRIBUTION_MODULES = [f"streams/{name}.py" for name in (
    "throttle_index", "evidence", "culprits", "gpu_events", "thread_budget", "wait_index", "split_columns",
    "wait_charges", "wait_columns", "rolling_median", "causes", "wait_chain", "evidence_clock", "span_keys",
    "attribution")]
#: the worker's own hot-path files: the baseline runs them as committed at MIX_BEFORE
HOT_PATH = ["streams/store_queue.py", "streams/app.py", "streams/sink.py", "streams/clickhouse.py",
            "streams/attribution.py", "streams/handlers.py", "streams/alert_groups.py", "streams/throttle_index.py",
            "streams/host_state.py", "schemas/events.py"]
TABLES = ("runq_events", "requests", "irq_time", "cgroup_throttle", "latency_histograms")
TICK_S = 0.05


def host_rate() -> float:
    return SPEEDUP * sum(BUSY_HOST.values())


def setup_records(host: str, now: int) -> list[tuple[str, list[events.Record]]]:
    """Topology and processes: what a collector sends first."""
    cpus = list(range(64))
    topo = events.Topology(host=host, boot_id="mix", seq=0, ts_ns=now, cpus=cpus, numa_nodes=[])
    procs = [events.ProcessInfo(host=host, boot_id="mix", seq=i, ts_ns=now, pid=pid, comm="vllm",
                                cmdline="vllm serve", cgroup="/kubepods/serving/vllm", cpus_allowed=cpus[:32],
                                serving_group=SERVING[0] if pid != SERVING[0] else 0, ppid=1)
             for i, pid in enumerate(SERVING)]
    procs += [events.ProcessInfo(host=host, boot_id="mix", seq=100 + i, ts_ns=now, pid=pid, comm=comm,
                                 cmdline=comm, cgroup=f"/kubepods/batch{i}", cpus_allowed=cpus)
              for i, (pid, comm) in enumerate(SUSPECTS)]
    procs += [events.ProcessInfo(host=host, boot_id="mix", seq=200 + i, ts_ns=now, pid=pid, comm="trainer",
                                 cmdline="trainer", cgroup="/system.slice/trainer", cpus_allowed=cpus)
              for i, pid in enumerate(OTHERS)]
    return [(topics.TOPOLOGY, [topo]), (topics.PROCESSES, procs)]


class Mix:
    """The records one host sends, tick by tick (TICK_S each), at SPEEDUP."""

    def __init__(self, host: str):
        self.host = host
        self.seq = Counter()
        self.rate = {k: v * SPEEDUP for k, v in BUSY_HOST.items()}
        self.carry = Counter()

    def _next(self, kind: str) -> int:
        self.seq[kind] += 1
        return self.seq[kind]

    def _due(self, kind: str, period_s: float, tick: int) -> int:
        """How many records of ``kind`` this tick: its per-period batch when
        the period starts (the samplers publish in bursts), else 0."""
        ticks = max(1, round(period_s / TICK_S))
        return round(self.rate[kind] * period_s) if tick % ticks == 0 else 0

    def tick(self, tick: int, ts: int) -> list[tuple[str, list[events.Record]]]:
        h, ms = self.host, 1_000_000
        out = []
        n_runq = round(self.rate["runq"] * TICK_S)
        runq = []
        for _ in range(n_runq):
            s = self._next("runq")
            pid = SERVING[s % len(SERVING)] if s % 4 else OTHERS[s % len(OTHERS)]
            sp, sc = SUSPECTS[s % len(SUSPECTS)]
            # 64 threads a process, each waiting at most twice a tick, in different 12.5 ms slots of it: one
            # thread's waits never overlap (a thread cannot wait twice at once; attribution drops such repeats)
            tid = pid * 100 + (s % 64) // 16 * 16 + (s // 64) % 16
            end = ts - (s // 1024) % 4 * 12_500_000
            runq.append(events.RunqEvent(host=h, boot_id="mix", seq=s, ts_ns=end, pid=pid,
                                         tid=tid, comm="vllm", cpu=s % 64,
                                         wait_ns=(12 if s % 100 == 0 else 5) * ms + s % 997, suspect_pid=sp,
                                         suspect_tid=sp, suspect_comm=sc))
        out += [(topics.RUNQ, runq[i:i + 500]) for i in range(0, len(runq), 500)]
        self.carry["spans"] += self.rate["spans"] * TICK_S
        n_spans, self.carry["spans"] = int(self.carry["spans"]), self.carry["spans"] % 1
        spans = []
        for _ in range(n_spans):
            s = self._next("spans")
            took = (400 if s % 50 == 0 else 50) * ms
            spans.append(events.RequestSpan(host=h, boot_id="mix", seq=s, ts_ns=ts, request_id=f"r{s}",
                                            trace_id="ab" * 16, span_id="cd" * 8, name="llm_request",
                                            pid=SERVING[0], start_ns=ts - took, end_ns=ts, status="ok"))
        if spans:
            out.append((topics.REQUESTS, spans))
        irq = [events.IrqTime(host=h, boot_id="mix", seq=self._next("irq"), ts_ns=ts, cpu=i // 2,
                              interval_ns=250 * ms, kind="softirq" if i % 2 else "hardirq",
                              source="NET_RX" if i % 2 else "nvme0q1", count=100, time_ns=(i % 7) * 100_000)
               for i in range(self._due("irq", 0.25, tick))]
        if irq:
            out.append((topics.IRQ, irq))
        cfs = [events.CgroupThrottle(host=h, boot_id="mix", seq=self._next("cfs"), ts_ns=ts,
                                     cgroup=f"/kubepods/batch{i % 32}", interval_ns=250 * ms, quota_us=200_000,
                                     period_us=100_000, nr_periods=2, nr_throttled=i % 2,
                                     throttled_ns=(i % 2) * 3 * ms)
               for i in range(self._due("cfs", 0.25, tick))]
        if cfs:
            out.append((topics.CGROUP_THROTTLE, cfs))
        hist = [events.LatencyHistogram(host=h, boot_id="mix", seq=self._next("hist"), ts_ns=ts,
                                        probe="runq" if i % 2 else "gpu_ioctl", interval_ns=10_000 * ms,
                                        pid=SERVING[i % 16] if i < 32 else 3000 + i, comm=f"c{i % 40}",
                                        slots=[1, 2, 3, 10, 12], counts=[500, 300, 100, 5, 1])
                for i in range(self._due("histograms", 10 / SPEEDUP, tick))]
        if hist:
            out.append((topics.HISTOGRAMS, hist))
        return out


def schedule(hosts: int, seconds: float, t0_ns: int, shape: str = "busy") -> list[tuple[float, str, bytes, bytes, int]]:
    """(send at, s after start; topic; key; NDJSON payload; records) of
    ``seconds`` of the mix (``shape``: "busy", Mix's hosts, or "vllm",
    vllm_mix's), the records stamped t0_ns + their send time."""
    import vllm_mix

    mixes = [Mix(f"mix{h}") if shape == "busy" else vllm_mix.VllmMix(f"mix{h}", TICK_S) for h in range(hosts)]
    out = []
    for tick in range(int(seconds / TICK_S)):
        at = tick * TICK_S
        for mix in mixes:
            for topic, records in mix.tick(tick, t0_ns + int(at * 1e9)):
                out.append((at, topic, mix.host.encode(), batches.encode_batch(records), len(records)))
    return out


def baseline_tree(directory: Path, rev: str = MIX_BEFORE) -> Path:
    """This tree's packages, laid out as the installed ``jitterscope``
    (pyproject's package-dir), with HOT_PATH as committed at ``rev`` (a file
    that did not exist then is removed)."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = directory / "jitterscope"
    shutil.copytree(REPO / mapping["jitterscope"], root, ignore=shutil.ignore_patterns("__pycache__"))
    for package, folder in mapping.items():
        if package != "jitterscope":
            shutil.copytree(REPO / folder, root / package.split(".", 1)[1],
                            ignore=shutil.ignore_patterns("__pycache__"))
    for path in HOT_PATH:
        top, rest = path.split("/", 1)
        listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", rev, path], capture_output=True,
                                check=True, text=True).stdout
        if not listed.strip():
            (root / top / rest).unlink(missing_ok=True)
            continue
        shown = _git_show(rev, path).decode()
        if path == "streams/sink.py":  # which tables are deduplicated is the store's choice, not the hot path's
            now = re.search(r"^ROLLUP_SOURCES = .*$", (REPO / path).read_text(), re.M)[0]
            shown = re.sub(r"^ROLLUP_SOURCES = .*$", lambda _m: now, shown, flags=re.M)
        (root / top / rest).write_text(shown)
    return directory


class MixWorker(StreamsWorker):
    def stored(self) -> int:
        from jitterscope.query import query_worker

        sql = " + ".join(f"(SELECT count() FROM jitterscope.{t})" for t in TABLES)  # from part metadata: cheap
        return query_worker(self._running_worker(self._settings), f"SELECT {sql}", {})[1][0][0]

    def sql(self, sql: str) -> list:
        from jitterscope.query import query_worker

        return query_worker(self._running_worker(self._settings), sql, {})[1]

    def setup(self, hosts: int, shape: str = "busy") -> None:
        import vllm_mix

        now, setup = time.time_ns(), setup_records if shape == "busy" else vllm_mix.setup_records
        processes = 0
        for h in range(hosts):
            for topic, records in setup(f"mix{h}", now):
                self.producer.produce(topic, batches.encode_batch(records), key=f"mix{h}".encode())
                processes += len(records) if topic == topics.PROCESSES else 0
        self.producer.flush(30)
        deadline = time.monotonic() + 60
        while self.sql("SELECT count() FROM jitterscope.processes WHERE host LIKE 'mix%'")[0][0] < processes:
            assert time.monotonic() < deadline, "process records not stored"
            time.sleep(0.2)

    def send(self, messages, paced: bool, t_start: float) -> float:
        """Produce; returns how late the last message went out (s)."""
        late = 0.0
        for at, topic, key, payload, _n in messages:
            if paced:
                wait = t_start + at - time.time()
                if wait > 0:
                    time.sleep(wait)
                late = max(late, -wait)
            while True:
                try:
                    self.producer.produce(topic, payload, key=key)
                    break
                except BufferError:
                    self.producer.poll(0.01)
            self.producer.poll(0)
        assert self.producer.flush(120) == 0, "the broker did not take every message"
        return late

    def wait_stored(self, total: int, timeout_s: float = 600) -> float:
        deadline = time.monotonic() + timeout_s
        while (n := self.stored()) < total:
            assert time.monotonic() < deadline, f"only {n} of {total} records stored"
            time.sleep(0.1)
        return time.perf_counter()


def _profile(pid: int, seconds: int, out_dir: Path, label: str):
    spy = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "py-spy"
    if not spy.exists():
        spy = Path(shutil.which("py-spy") or "py-spy")
    raw = out_dir / f"{label}.txt"
    return raw, subprocess.Popen([str(spy), "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "50",
                                  "--format", "raw", "--threads", "--output", str(raw), "--nonblocking"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_functions(raw: Path, n: int = 12) -> list[tuple[str, float, float]]:
    """(function, self share, inclusive share) from py-spy's collapsed stacks."""
    own, incl, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            incl[frame] += int(count)
    threads = [(f, c / total, c / total) for f, c in incl.most_common() if f.startswith("thread ")]
    return threads + [(f, c / total, incl[f] / total) for f, c in own.most_common(n)]


def _paced(worker: MixWorker, hosts: int, seconds: float, shape: str = "busy") -> dict:
    """The mix of ``hosts`` produced paced, stamped at send time: the run-queue
    alert delay (p50, p99, count) and the records/s stored meanwhile."""
    time.sleep(3)  # let the attribution of the phase before drain
    lead = 5 + seconds  # generation time
    t_start = time.time() + lead
    messages = schedule(hosts, seconds, int(t_start * 1e9), shape)
    assert time.time() < t_start, "generating the paced mix took longer than its lead"
    before = worker.stored()
    t0 = time.perf_counter() + (t_start - time.time())
    late = worker.send(messages, paced=True, t_start=t_start)
    done = worker.wait_stored(before + sum(m[4] for m in messages))
    delays = sorted(r[0] for r in worker.sql(
        "SELECT (toUnixTimestamp64Nano(raised) - toUnixTimestamp64Nano(ts)) / 1e9 FROM jitterscope.alerts "
        f"WHERE kind = 'runq_starvation' AND host LIKE 'mix%' AND ts >= fromUnixTimestamp64Nano({int(t_start * 1e9)})"))
    pct = lambda q: delays[min(len(delays) - 1, int(q * len(delays)))] if delays else float("nan")  # noqa: E731
    return dict(rate=sum(m[4] for m in messages) / (done - t0), late=late, p50=pct(0.5), p99=pct(0.99),
                alerts=len(delays))


def measure(tree: Path | None, hosts: int, seconds: float, label: str, profile_dir: Path | None,
            paced_hosts: tuple[int, ...] | None = None, shape: str = "busy", **worker_settings: str) -> dict:
    """Capacity at ``hosts`` hosts, then the alert delay paced at each of
    ``paced_hosts`` (default: ``hosts``; none: ())."""
    settings = dict(request_slo_ms="300", runq_alert_ms="10") | worker_settings
    with MixWorker(tree=tree, **settings) as worker:
        worker.setup(hosts, shape)
        # capacity: the whole mix at once
        messages = schedule(hosts, seconds, time.time_ns() - int(seconds * 1e9), shape)
        total = sum(m[4] for m in messages)
        spy = _profile(worker.proc.pid, int(seconds * 3), profile_dir, label) if profile_dir else None
        before = worker.stored()
        t0 = time.perf_counter()
        worker.send(messages, paced=False, t_start=0)
        done = worker.wait_stored(before + total)
        capacity = total / (done - t0)
        if spy:
            spy[1].wait()
        paced = {n: _paced(worker, n, seconds, shape) for n in (paced_hosts if paced_hosts is not None else (hosts,))}
    top = top_functions(spy[0]) if spy and spy[0].exists() else []
    return dict(capacity=capacity, total=total, paced=paced, top=top)


def _spread(values: list[float], fmt: str) -> str:
    """The median of the rounds, and their range when there are several."""
    values = sorted(values)
    median = statistics.median(values)
    return fmt.format(median) + (f" ({fmt.format(values[0])}–{fmt.format(values[-1])})" if len(values) > 1 else "")


def bench_pipeline_mix(target: float = 200_000, seconds: float = 6.0, rounds: int = 3) -> str:
    hosts = max(1, round(target / host_rate()))
    paced_hosts = (1, hosts)
    profile_dir = Path(os.environ["BENCH_PROFILE"]) if os.environ.get("BENCH_PROFILE") else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = baseline_tree(Path(tmp))
        for r in range(rounds):  # alternating, the order flipped each round
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                tree = before_tree if label == "before" else None
                runs[label].append(measure(tree, hosts, seconds, f"{label}-{r}", profile_dir if r == 0 else None,
                                           paced_hosts=paced_hosts))
    ours, base = runs["after"], runs["before"]
    what = (f"busy-host mix x{SPEEDUP} ({{n}} hosts, {{rate:,.0f}} records/s: runq, spans, irq/cfs every 0.25 s, "
            f"histograms), every rule on → 1 Faust worker → chDB")
    cap = lambda rs: [r["capacity"] for r in rs]  # noqa: E731
    ratio = statistics.median(cap(ours)) / statistics.median(cap(base))
    lines = [f"| {what.format(n=hosts, rate=hosts * host_rate())}: capacity ({ours[0]['total']:,} records at once), "
             f"median of {rounds} alternating rounds (range) | {_spread(cap(ours), '{:,.0f}')} records/s stored | "
             f"hot path as at {MIX_BEFORE}: {_spread(cap(base), '{:,.0f}')} records/s | {ratio:.2f}x |"]
    for n in paced_hosts:
        got = lambda rs, key: [r["paced"][n][key] for r in rs]  # noqa: E731
        p99 = statistics.median(got(ours, "p99")) / statistics.median(got(base, "p99"))
        lines.append(f"| {what.format(n=n, rate=n * host_rate())}: paced for {seconds:.0f} s, run-queue alert delay "
                     f"(raised − event end) | p50 {_spread(got(ours, 'p50'), '{:.3f}')} s, "
                     f"p99 {_spread(got(ours, 'p99'), '{:.3f}')} s ({ours[0]['paced'][n]['alerts']:,} alerts; "
                     f"{_spread(got(ours, 'rate'), '{:,.0f}')} records/s stored) | as at {MIX_BEFORE}: "
                     f"p50 {_spread(got(base, 'p50'), '{:.3f}')} s, p99 {_spread(got(base, 'p99'), '{:.3f}')} s "
                     f"({_spread(got(base, 'rate'), '{:,.0f}')} records/s) | p99 {p99:.2f}x |")
    for label, result in ((MIX_BEFORE, base[0]), ("this tree", ours[0])):
        if result["top"]:
            lines.append(f"\npy-spy top (self, inclusive), {label}, capacity phase, first round:\n")
            lines += [f"    {own:5.1%} {incl:5.1%}  {fn}" for fn, own, incl in result["top"]]
    return "\n".join(lines)


def vllm_host_rate() -> float:
    """Records per second one vLLM-shaped host sends (bench/vllm_mix.py), counted over 10 s of it."""
    import vllm_mix

    mix = vllm_mix.VllmMix("rate", TICK_S)
    ticks = int(10 / TICK_S)
    return sum(len(records) for tick in range(ticks) for _topic, records in mix.tick(tick, 10**18)) / 10


def bench_vllm_capacity(target: float = 200_000, seconds: float = 6.0, rounds: int = 2) -> str:
    """This tree's worker under enough vLLM-shaped hosts to offer ``target``
    records/s, every rule on: capacity (the mix at once) and a py-spy
    profile of the first round (the worker's hot path has changed too much
    since MIX_BEFORE for that baseline to run beside today's modules; the
    alert delay has its own benches, and this mix's waits stay under the
    10 ms alarm)."""
    rate = vllm_host_rate()
    hosts = max(1, round(target / rate))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(None, hosts, seconds, f"vllm-{r}", Path(tmp) if r == 0 else None, paced_hosts=(),
                        shape="vllm") for r in range(rounds)]
    cap = [r["capacity"] for r in runs]
    lines = [f"| vLLM-shaped hosts (bench/vllm_mix.py, {rate:,.0f} records/s each) x{hosts} "
             f"({hosts * rate:,.0f} records/s offered), every rule on → 1 Faust worker → chDB: capacity "
             f"({runs[0]['total']:,} records at once), {rounds} rounds (range) | {_spread(cap, '{:,.0f}')} records/s "
             f"stored | the goal: {target:,.0f} records/s | {statistics.median(cap) / target:.2f}x |"]
    if runs[0]["top"]:
        lines.append("\npy-spy top (self, inclusive), capacity phase, first round:\n")
        lines += [f"    {own:5.1%} {incl:5.1%}  {fn}" for fn, own, incl in runs[0]["top"]]
    return "\n".join(lines)


def bench_sink_batch(target: float = 200_000, seconds: float = 6.0, sizes=(5_000, 20_000, 50_000)) -> str:
    """The same mix and worker (this tree) with ``sink_batch_rows`` at each of
    ``sizes``: rows per ClickHouse insert, the sink's main lever. The first
    size is the baseline."""
    hosts = max(1, round(target / host_rate()))
    results = {n: measure(None, hosts, seconds, f"rows-{n}", None, sink_batch_rows=str(n)) for n in sizes}
    base = results[sizes[0]]
    return "\n".join(
        f"| busy-host mix x{SPEEDUP} ({hosts} hosts), sink_batch_rows={n:,} | capacity {r['capacity']:,.0f} records/s; "
        f"paced: alert delay p50 {r['paced'][hosts]['p50']:.3f} s, p99 {r['paced'][hosts]['p99']:.3f} s, "
        f"{r['paced'][hosts]['rate']:,.0f} records/s stored | "
        f"sink_batch_rows={sizes[0]:,}: {base['capacity']:,.0f} records/s | {r['capacity'] / base['capacity']:.2f}x |"
        for n, r in results.items())


def _attribute_mix(attribution_module, seconds: float, shape: str = "extreme",
                   ticks_per_due: int = 5, phases: bool = False) -> tuple[float, list]:
    """One host's mix (``seconds`` of it; ``shape``: "extreme", Mix's 1,024
    serving threads, or "vllm", vllm_mix's) fed to an Attributor from
    ``attribution_module`` as the worker feeds it, with due() every
    ticks_per_due ticks (the worker's 0.25 s timer); (seconds in due(), results)."""
    import vllm_mix
    from jitterscope.streams.host_state import HostState

    state = HostState()
    t0 = 1_800_000_000_000_000_000  # the same mix in every run: results compare
    setup, mix = ((setup_records, Mix("mix0")) if shape == "extreme"
                  else (vllm_mix.setup_records, vllm_mix.VllmMix("mix0", TICK_S, phases)))
    for _topic, records in setup("mix0", t0):
        for record in records:
            state.learn(record)
    attributor = attribution_module.Attributor(grace_ns=2_000_000_000, horizon_ns=300_000_000_000,
                                               slo_ns=300_000_000, processes=state)
    spent, out = 0.0, []
    ticks = int(seconds / TICK_S)
    for tick in range(ticks + int(3 / TICK_S)):  # then 3 s more: the last grace periods end
        now = t0 + int(tick * TICK_S * 1e9)
        for topic, records in (mix.tick(tick, now) if tick < ticks else []):
            if topic == topics.REQUESTS:
                for span in records:
                    attributor.add_request(span)
            elif topic == topics.RUNQ:
                attributor.add_evidence_many(records)
            elif topic in (topics.IRQ, topics.CGROUP_THROTTLE):
                for record in records:
                    attributor.add_evidence(record)
        if tick % ticks_per_due == 0:
            started = time.perf_counter()
            out += attributor.due(now)
            spent += time.perf_counter() - started
    return spent, out


#: attribution-mix's shapes: (name, seconds of it, what its row says)
ATTRIBUTION_SHAPES = [
    ("vllm", 10.0, "a vLLM-shaped host (API server of 4 threads + EngineCore of 40, ~3,500 serving waits/s, "
                   "300 spans/s of 20 ms-1.5 s, no two windows alike)"),
    ("extreme", 4.0, f"one busy host's mix x{SPEEDUP} (16-process serving group of 1,024 threads, "
                     f"{SPEEDUP * BUSY_HOST['runq'] * 3 // 4:,} serving waits/s)"),
]


def bench_attribution_mix(rounds: int = 3, shapes: str = os.environ.get("BENCH_SHAPES", "vllm,extreme")) -> str:
    """The attribution step alone under each of ATTRIBUTION_SHAPES, against
    attribution and its modules as at ATTRIBUTION_BEFORE in the same
    process, alternating; asserts both attribute every request the same."""
    from jitterscope.streams import attribution

    before = _modules_at(ATTRIBUTION_BEFORE, ATTRIBUTION_MODULES)["streams/attribution.py"]
    rows = []
    for shape, seconds, what in ATTRIBUTION_SHAPES:
        if shape not in shapes.split(","):
            continue
        took: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(rounds):
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                spent, out = _attribute_mix(before if label == "before" else attribution, seconds, shape)
                took[label].append(spent)
                if label == "before":
                    expected = out
                else:
                    result = out
            # span ids came later: the baseline leaves them empty (the mix's spans carry no phases, no model)
            assert [replace(a, span_id="") for a in result] == expected, \
                "the attribution differs from the modules as at " + ATTRIBUTION_BEFORE
        spans = len(result)
        rates = {label: [spans / t for t in times] for label, times in took.items()}
        cost = {label: [t / spans * 1e6 for t in times] for label, times in took.items()}
        ratio = statistics.median(took["before"]) / statistics.median(took["after"])
        rows.append(f"| attribute {what}: {seconds:.0f} s, {spans:,} requests, median of {rounds} alternating rounds | "
                    f"{_spread(rates['after'], '{:,.0f}')} requests/s = {_spread(cost['after'], '{:,.0f}')} "
                    f"us a request | as at {ATTRIBUTION_BEFORE}: {_spread(rates['before'], '{:,.0f}')} requests/s = "
                    f"{_spread(cost['before'], '{:,.0f}')} us a request | {ratio:.2f}x |")
    return "\n".join(rows)
