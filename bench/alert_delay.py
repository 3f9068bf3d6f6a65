# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py alert-delay`: how long after a run-queue wait ends its alert
is raised (``raised − ts``), in a starvation storm on this host under
`jitterscope up` (embedded broker, the real collector and its BPF probes, one
streams worker, chDB), against the same storm with the alert path as at
BEFORE, in the same run.

At BEFORE the collector started its symbolizer on the first stack (the
storm's), read the ring buffer every 50 ms whatever it held, the worker
fetched with the same wait whether or not records flowed (the embedded
broker holds every fetch its full wait), and `up` said "watching" before the
worker had read anything. (The sections of bench/RESULTS.md before
2026-12-03 compared against f0e043d, whose worker no longer runs beside
today's modules.) The baseline is this tree with BASELINE_FILES as committed
at BEFORE, run through PYTHONPATH (bench/mix.py does the same for its hot
path).

Each run starts `up` fresh (watching every process, as `make up` does), runs
`jitterscope.workload.starvation()` (a victim with a bursty loop pinned to one
CPU with three CPU hogs; every one of them is a process new to the collector,
so its first waits arrive before its process record) once `up` says it is
watching, waits until the storm's stored alerts stand still, stops `up` with
Ctrl-C and reads the storm processes' run-queue alerts from the store. Runs
alternate the two trees (this machine is shared and noisy). The figures are
over all the alerts of each tree's runs together; `up`'s own stop summary
(the worker's alert-delay histogram on /metrics) is shown for this tree.

`bench/run.py alert-delay-steady` does the same with one host's steady rate
of alerts instead of a storm (``bursts``: one alert every half second on an
otherwise quiet host, where most fetches before an alert come back empty).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from common import REPO, StreamsWorker, _git_show  # noqa: E402  (bench/ is on sys.path)

#: the alert path before its storm-start and poll delays went
BEFORE = "566e688"
#: what made those delays: the collector's run-queue probe, symbolizer and batching, the worker's fetch
#: patches and its settings, and `up`
BASELINE_FILES = ["bpf/runq.bpf.c", "bpf/runq.h", "collector/probes/runq.py", "collector/publish.py",
                  "collector/stacks.py", "streams/kafka_patches.py", "streams/app.py", "common/settings.py",
                  "cli/up.py"]
#: the same for the worker alone (alert-delay-worker)
WORKER_FILES = ["streams/kafka_patches.py", "streams/app.py", "common/settings.py"]
VICTIM = "jsalertdelay"  # not the demo's name: other runs on this machine may use that one
CLI = [sys.executable, "-m", "jitterscope.cli"]
STORM_S = 10.0
QUIET_S = 5.0  # the storm's stored alerts stood still this long: every parked wait (3 s at most) is judged


def baseline_tree(directory: Path, rev: str = BEFORE, files: list[str] = BASELINE_FILES) -> Path:
    """This tree's packages laid out as the installed ``jitterscope``, with
    ``files`` as committed at ``rev``."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = directory / "jitterscope"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / mapping["jitterscope"], root, ignore=ignore)
    for package, folder in mapping.items():
        if package != "jitterscope":
            shutil.copytree(REPO / folder, root / package.split(".", 1)[1], ignore=ignore)
    folders = {folder: package.split(".")[1:] for package, folder in mapping.items()}  # cli -> [] (the root)
    for path in files:
        top, rest = path.split("/", 1)
        root.joinpath(*folders[top], rest).write_bytes(_git_show(rev, path))
    return directory


def _children_named(comm: str) -> list[int]:
    """Pids of this process's children called ``comm`` (the storm's hogs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if name == comm and int(rest[1]) == os.getpid():
                found.append(int(entry.name))
    return found


def _metrics(port: int) -> str:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return ""


def _summed(text: str, prefix: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def storm(seconds: float) -> set[int]:
    """The starvation storm (a victim and 3 CPU hogs on one CPU), run to its
    end; its processes' pids."""
    from jitterscope.workload import HOG_COMM, starvation

    pids: set[int] = set()
    with starvation(seconds=seconds, hogs=3, delay=1.0, name=VICTIM) as victim:
        pids.add(victim.pid)
        while len(pids) < 4 and victim.poll() is None:
            pids.update(_children_named(HOG_COMM))
            time.sleep(0.05)
    return pids


#: one hog burst every BURST_EVERY_S: the sparse alerts of an otherwise quiet host (alert-delay-steady)
BURST_EVERY_S, BURST_S = 0.5, 0.02
_SPINNER = "import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nend = time.time() + {seconds}\n"
_BURSTS = (_SPINNER + "os.nice(-20)\nwhile time.time() < end:\n    time.sleep({every})\n    t = time.time()\n"
           "    while time.time() - t < {burst}: pass\n")


def bursts(seconds: float) -> set[int]:
    """A victim spinning on one CPU and a nice -20 hog that spins BURST_S
    there every BURST_EVERY_S: one wait of ~BURST_S, so one alert, per burst
    and nothing in between. Run to its end; the victim's pid."""
    from jitterscope.workload import last_cpu

    cpu = last_cpu()
    victim = subprocess.Popen([sys.executable, "-c", (_SPINNER + "while time.time() < end: pass\n").format(
        cpu=cpu, seconds=seconds)])
    hog = subprocess.Popen([sys.executable, "-c", _BURSTS.format(cpu=cpu, seconds=seconds, every=BURST_EVERY_S,
                                                                 burst=BURST_S)])
    try:
        victim.wait(seconds + 60)
    finally:
        for proc in (victim, hog):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return {victim.pid}


class UpRun:
    """`jitterscope up` started fresh (watching every process, as `make up`
    does) in a temporary data directory, from ``tree`` (None: this one):
    its environment, data directory, web port and printed lines."""

    def __init__(self, data: str, env: dict, web: int):
        self.data, self.env, self.web, self.lines = data, env, web, []
        # cwd: not the repository root, whose jitterscope/ would come first on sys.path and hide the tree
        self.up = subprocess.Popen([*CLI, "up", "--broker-port", "0", "--duration", "900"], env=env, cwd=data,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.up.stdout.readline, "")),
                                       daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 300
        while not any(line.startswith("jitterscope up: watching") for line in self.lines):
            assert self.up.poll() is None and time.monotonic() < deadline, "up did not start:\n" + "".join(self.lines)
            time.sleep(0.2)

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; it must exit 0."""
        self.up.send_signal(signal.SIGINT)
        assert self.up.wait(300) == 0, "".join(self.lines)

    def query(self, sql: str) -> list[list[float]]:
        out = subprocess.run([*CLI, "query", "-f", "csv", sql], env=self.env, cwd=self.data, capture_output=True,
                             text=True, timeout=300, check=True)
        return [list(map(float, v.split(","))) for v in out.stdout.splitlines()[1:] if v.strip()]

    def summary(self) -> str:
        return next((line.strip() for line in self.lines if line.startswith("alert delay")), "")


@contextmanager
def running_up(tree: Path | None, extra_env: dict | None = None):
    """An UpRun, killed if it is still running when the block ends."""
    from jitterscope.broker import free_port

    with tempfile.TemporaryDirectory() as data:
        web = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env.update(JITTERSCOPE_DATA_DIR=data, JITTERSCOPE_STREAMS_WEB_PORT=str(web),
                   JITTERSCOPE_COLLECTOR_METRICS_PORT="0", JITTERSCOPE_OTLP_PORT="0",
                   JITTERSCOPE_KAFKA_SESSION_TIMEOUT_S="6")
        if tree:  # before site-packages, so it wins over the editable install
            env["PYTHONPATH"] = str(tree)
        env.update(extra_env or {})
        run = UpRun(data, env, web)
        try:
            yield run
        finally:
            if run.up.poll() is None:
                run.up.kill()
                run.up.wait()
            run.reader.join(10)


def storm_under_up(tree: Path | None, seconds: float = STORM_S, extra_env: dict | None = None,
                   workload=storm) -> dict:
    """One `up` run with one ``workload`` (seconds -> the pids whose alerts
    count), started once `up` says it is watching: their alert delays (s)
    and up's stop summary."""
    from jitterscope.common.settings import load
    from jitterscope.query import query_worker, running_worker

    with running_up(tree, extra_env) as run:
        pids = workload(seconds)
        # every alert of the storm stored: their count stood still (the host's other processes may
        # raise alerts all along, so not the worker's whole count)
        worker = running_worker(load(data_dir=Path(run.data)))
        stored = (f"SELECT count() FROM jitterscope.alerts WHERE kind = 'runq_starvation' "
                  f"AND pid IN ({', '.join(map(str, sorted(pids)))})")
        last, since, deadline = None, time.monotonic(), time.monotonic() + 300
        while time.monotonic() - since < QUIET_S and time.monotonic() < deadline:
            count = query_worker(worker, stored, {})[1][0][0]
            if count != last:
                last, since = count, time.monotonic()
            time.sleep(0.5)
        text = _metrics(run.web)
        run.stop()
        rows = [tuple(r) for r in run.query(
            "SELECT (toUnixTimestamp64Nano(raised) - toUnixTimestamp64Nano(ts)) / 1e9 AS s, "
            "toUnixTimestamp64Nano(ts) AS t, pid FROM jitterscope.alerts "
            f"WHERE kind = 'runq_starvation' AND pid IN ({', '.join(map(str, sorted(pids)))}) ORDER BY t")]
        summary = run.summary()
    values = [r[0] for r in rows]
    assert summary, "up printed no alert delay at stop"
    parked = {why: _summed(text, f'jitterscope_streams_runq_judged_late_total{{why="{why}"}}')
              for why in ("arrived", "deadline", "overflow", "flush")}
    return {"delays": sorted(values), "rows": rows, "summary": summary, "processes": len(pids),
            "parked": _summed(text, "jitterscope_streams_runq_parked_total "), "judged_late": parked}


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def quantiles_ms(values: list[float]) -> str:
    """p50, p90 and p99 of sorted delays (s), in ms."""
    return ", ".join(f"p{q * 100:.0f} {_pct(values, q) * 1e3:,.0f} ms" for q in (0.5, 0.9, 0.99))


STORM_WHAT = f"a {STORM_S:.0f} s starvation storm under `jitterscope up` (victim + 3 hogs, all new processes)"
STEADY_S = 60.0
STEADY_WHAT = (f"{STEADY_S:.0f} s of sparse alerts under `jitterscope up` (a nice -20 hog spinning "
               f"{BURST_S * 1e3:.0f} ms on the victim's CPU every {BURST_EVERY_S:g} s: one alert a burst)")


def bench_alert_delay_steady(rounds: int = int(os.environ.get("BENCH_ALERT_ROUNDS", "2"))) -> str:
    return bench_alert_delay(rounds, bursts, STEADY_S, STEADY_WHAT)


#: `alert-delay-stages`: the baseline arm is this tree with `up` running one streams process (judge,
#: attribution and store on one loop), against its default, the judge apart (streams/stages.py)
ONE_PROCESS = {"JITTERSCOPE_UP_STAGES": "false"}


def bench_alert_delay_stages(rounds: int = int(os.environ.get("BENCH_ALERT_ROUNDS", "2"))) -> str:
    return bench_alert_delay(rounds, before_env=ONE_PROCESS)


def bench_alert_delay(rounds: int = int(os.environ.get("BENCH_ALERT_ROUNDS", "2")), workload=storm,
                      seconds: float = STORM_S, what: str = STORM_WHAT, before_env: dict | None = None) -> str:
    """``before_env``: the baseline is this tree with these settings (not the tree at BEFORE)."""
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = None if before_env else baseline_tree(Path(tmp))
        for r in range(rounds):  # alternating, the order flipped each round
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                result = storm_under_up(before_tree if label == "before" else None, seconds,
                                        extra_env=before_env if label == "before" else None, workload=workload)
                runs[label].append(result)
                d = result["delays"]
                print(f"<!-- round {r} {label}: {len(d)} alerts, p50 {_pct(d, 0.5):.3f} s, "
                      f"p90 {_pct(d, 0.9):.3f} s, p99 {_pct(d, 0.99):.3f} s; {result['summary']}; parked "
                      f"{result['parked']:.0f} (judged late: {result['judged_late']}) -->",
                      file=sys.stderr, flush=True)

    def figures(label: str) -> tuple[str, float]:
        d = sorted(x for run in runs[label] for x in run["delays"])
        per_run = lambda q: ", ".join(f"{_pct(run['delays'], q) * 1e3:,.0f}" for run in runs[label])  # noqa: E731
        return (f"p50 {_pct(d, 0.5) * 1e3:,.0f} ms, p90 {_pct(d, 0.9) * 1e3:,.0f} ms, "
                f"p99 {_pct(d, 0.99) * 1e3:,.0f} ms, "
                f"max {d[-1] * 1e3 if d else float('nan'):,.0f} ms ({len(d):,} alerts; per run: p50 {per_run(0.5)} ms, "
                f"p99 {per_run(0.99)} ms)"), _pct(d, 0.99)

    ours, our_p99 = figures("after")
    base, base_p99 = figures("before")
    median_p50 = statistics.median(_pct(run["delays"], 0.5) for run in runs["after"])
    summaries = "; ".join(run["summary"] for run in runs["after"] if run["summary"]) or "none printed"
    return (f"| run-queue alert delay (raised − wait end) in {what}, {rounds} alternating rounds | {ours} | "
            f"{'one streams process' if before_env else f'the alert path as at {BEFORE}'}: {base} | "
            f"p99 {our_p99 / base_p99:.2f}x |\n"
            f"\n`up`'s stop summary (the worker's histogram), this tree: {summaries} (median per-run p50 "
            f"{median_p50 * 1e3:,.0f} ms)\n")


def bench_alert_delay_collector(rounds: int = int(os.environ.get("BENCH_ALERT_ROUNDS", "2"))) -> str:
    """The same storm, this tree both times: the collector sending every
    pending batch as soon as a wait of runq_alert_ms is read
    (``batch_alerts_at_once``, the default) against waiting out
    ``batch_max_delay_ms`` as before (``batch_alerts_at_once=false``)."""
    arms = {"at once": {}, "after the batch delay": {"JITTERSCOPE_BATCH_ALERTS_AT_ONCE": "false"}}
    runs: dict[str, list[list[float]]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in (list(arms) if r % 2 == 0 else list(reversed(arms))):
            runs[arm].append(storm_under_up(None, extra_env=arms[arm])["delays"])
            d = runs[arm][-1]
            print(f"<!-- round {r} {arm}: {len(d)} alerts, p50 {_pct(d, 0.5):.3f} s, p99 {_pct(d, 0.99):.3f} s -->",
                  file=sys.stderr, flush=True)

    def figures(arm: str) -> tuple[str, float]:
        d = sorted(x for run in runs[arm] for x in run)
        per_run = lambda q: ", ".join(f"{_pct(run, q) * 1e3:,.0f}" for run in runs[arm])  # noqa: E731
        return (f"{quantiles_ms(d)} ({len(d):,} alerts; per run p50 {per_run(0.5)} ms, p99 {per_run(0.99)} ms)"),\
            _pct(d, 0.5)

    ours, our_p50 = figures("at once")
    base, base_p50 = figures("after the batch delay")
    return (f"| run-queue alert delay in a {STORM_S:.0f} s starvation storm under `jitterscope up`, "
            f"{rounds} alternating rounds: batches sent at once after an alert-worthy wait | {ours} | "
            f"after the batch delay (batch_alerts_at_once=false): {base} | p50 {our_p50 / base_p50:.2f}x |")


# -- the same question with the collector's timing replayed: `bench/run.py alert-delay-worker` ----------------

#: one host's synthetic storm, replayed into one streams worker: run-queue events of known processes, of a
#: process new every NEW_EVERY_S (its record follows RECORD_AFTER_S later on the processes topic, as the
#: collector describes a process at its first event) and of one gone every GONE_EVERY_S (it exited before the
#: collector described it: no record ever comes, the in-line wait ran its full second)
SYNTH_HOST = "storm"
KNOWN = list(range(5000, 5016))
TICK_S, RATE = 0.05, 2_000  # events/s, one message per tick
NEW_EVERY_S, RECORD_AFTER_S, GONE_EVERY_S = 1.0, 0.15, 2.0


def _synthetic_messages(seconds: float, t0_ns: int) -> tuple[list[tuple[float, str, bytes]], dict[int, str]]:
    """(send at, s after start; topic; NDJSON) and pid -> its class (known, new, gone)."""
    from jitterscope.schemas import batches, events, topics

    per_tick, seq, out, classes = int(RATE * TICK_S), 0, [], {pid: "known" for pid in KNOWN}
    ticks = int(seconds / TICK_S)
    for tick in range(ticks):
        at, ts = tick * TICK_S, t0_ns + int(tick * TICK_S * 1e9)
        pids = [KNOWN[i % len(KNOWN)] for i in range(per_tick)]
        if tick % round(NEW_EVERY_S / TICK_S) == 0:
            new = 6000 + tick
            classes[new] = "new"
            pids[0] = new
            info = events.ProcessInfo(host=SYNTH_HOST, boot_id="syn", seq=100_000 + tick, ts_ns=ts, pid=new,
                                      comm="fresh", cmdline="fresh", cgroup="/system.slice/fresh", cpus_allowed=[2, 3])
            out.append((at + RECORD_AFTER_S, topics.PROCESSES, batches.encode_batch([info])))
        if tick % round(GONE_EVERY_S / TICK_S) == 5:
            classes[7000 + tick] = "gone"
            pids[1] = 7000 + tick
        batch = []
        for i, pid in enumerate(pids):
            seq += 1
            worthy = i < 2 or i % 5 == 0  # a new or gone process's one event is worthy, and one in five
            batch.append(events.RunqEvent(host=SYNTH_HOST, boot_id="syn", seq=seq, ts_ns=ts, pid=pid,
                                          tid=pid * 10 + i % 8, comm="w", cpu=i % 8,
                                          wait_ns=(12 if worthy else 6) * 1_000_000,
                                          suspect_pid=300, suspect_tid=300, suspect_comm="batch"))
        out.append((at, topics.RUNQ, batches.encode_batch(batch)))
    return sorted(out, key=lambda m: m[0]), classes


def synthetic_storm(tree: Path | None, seconds: float = 10.0) -> dict[str, list[float]]:
    """Alert delays (s) per class of process of one replayed storm."""
    from jitterscope.query import query_worker
    from jitterscope.schemas import batches, events, topics

    with StreamsWorker(tree=tree, runq_alert_ms="10") as worker:
        sql = lambda q: query_worker(worker._running_worker(worker._settings), q, {})[1]  # noqa: E731
        now, key = time.time_ns(), SYNTH_HOST.encode()
        worker.producer.produce(topics.TOPOLOGY, batches.encode_batch([events.Topology(
            host=SYNTH_HOST, boot_id="syn", seq=0, ts_ns=now, cpus=list(range(8)), numa_nodes=[])]), key=key)
        worker.producer.produce(topics.PROCESSES, batches.encode_batch([events.ProcessInfo(
            host=SYNTH_HOST, boot_id="syn", seq=i, ts_ns=now, pid=pid, comm="w", cmdline="w",
            cgroup="/system.slice/w", cpus_allowed=[0, 1]) for i, pid in enumerate(KNOWN)]), key=key)
        worker.producer.flush(30)
        deadline = time.monotonic() + 120
        while sql(f"SELECT count() FROM jitterscope.processes WHERE host = '{SYNTH_HOST}'")[0][0] < len(KNOWN):
            assert time.monotonic() < deadline, "process records not stored"
            time.sleep(0.2)
        t_start = time.time() + 2
        messages, classes = _synthetic_messages(seconds, int(t_start * 1e9))
        worthy = sum(e.wait_ns >= 10_000_000 for _, topic, payload in messages if topic == topics.RUNQ
                     for e in batches.BatchDecoder(events.RunqEvent).decode(payload)[0])
        for at, topic, payload in messages:
            if (wait := t_start + at - time.time()) > 0:
                time.sleep(wait)
            worker.producer.produce(topic, payload, key=key)
            worker.producer.poll(0)
        worker.producer.flush(60)
        deadline = time.monotonic() + 300
        count = f"SELECT count() FROM jitterscope.alerts WHERE host = '{SYNTH_HOST}' AND kind = 'runq_starvation'"
        while sql(count)[0][0] < worthy:
            assert time.monotonic() < deadline, "not every alert was stored"
            time.sleep(0.5)
        rows = sql("SELECT pid, (toUnixTimestamp64Nano(raised) - toUnixTimestamp64Nano(ts)) / 1e9, seq, kind, "
                   "severity, summary, remedy, cpus_allowed FROM "
                   f"jitterscope.alerts WHERE host = '{SYNTH_HOST}' AND kind = 'runq_starvation'")
    out: dict = {"all": []}
    for pid, delay, *_ in rows:
        out.setdefault(classes[pid], []).append(delay)
        out["all"].append(delay)
    return {**{k: sorted(v) for k, v in out.items()},
            "verdicts": sorted((seq, *map(str, rest)) for _pid, _delay, seq, *rest in rows)}


def bench_alert_delay_worker(rounds: int = int(os.environ.get("BENCH_ALERT_ROUNDS", "2"))) -> str:
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = baseline_tree(Path(tmp), files=WORKER_FILES)
        for r in range(rounds):
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                runs[label].append(synthetic_storm(before_tree if label == "before" else None))

    def figures(label: str, kind: str) -> str:
        d = sorted(x for run in runs[label] for x in run.get(kind, []))
        return (f"p50 {_pct(d, 0.5) * 1e3:,.0f} ms, p99 {_pct(d, 0.99) * 1e3:,.0f} ms ({len(d):,})" if d else "none")

    same = all(run["verdicts"] == runs["before"][0]["verdicts"] for run in runs["before"] + runs["after"])
    rows = []
    for kind, what in (("all", f"every alert (the same verdicts, field for field, in every run: {same})"),
                       ("known", "known processes' alerts"),
                       ("new", f"new processes' alerts (record {RECORD_AFTER_S * 1e3:.0f} ms after)"),
                       ("gone", "gone processes' alerts (no record ever)")):
        after = sorted(x for run in runs["after"] for x in run.get(kind, []))
        before = sorted(x for run in runs["before"] for x in run.get(kind, []))
        rows.append(f"| one host's replayed storm ({RATE:,}/s run-queue events, 1 message per {TICK_S * 1e3:.0f} ms, "
                    f"a new process every {NEW_EVERY_S:g} s, a gone one every {GONE_EVERY_S:g} s) → 1 worker, "
                    f"{rounds} alternating rounds: {what} | {figures('after', kind)} | the worker as at {BEFORE}: "
                    f"{figures('before', kind)} | p99 {_pct(after, 0.99) / _pct(before, 0.99):.2f}x |")
    return "\n".join(rows)
