# SPDX-License-Identifier: Apache-2.0
"""The collector's bursts: how long it runs on a CPU at a time (issue 39).

A thread that runs for 5 ms without switching out holds a CPU a serving
thread may be waiting for; that is the collector's cost as a culprit, not
its average share. Two views, in the same run:

1. The kernel's: a BCC program on ``sched_switch`` times every on-CPU run
   ("slice") of the collector's threads: switch-out minus the last switch-in
   on that CPU (per-CPU array, so no hash update per switch). Per thread:
   runs, runs over 1 ms, the longest; and a log2 histogram.
2. The code's: the collector child runs with its loop steps wrapped in
   ``time.thread_time_ns`` (CPU time of that thread only, so preemption by
   others does not count), so each burst is named: target rescans, probe
   rescans, histograms, stats, span intake, polls.

The host: a vLLM-shaped stand-in (examples/multiprocess_standin.py) sends
spans, so a serving group exists; 300 idle processes make /proc the size of
a real host's; a shell forks a short-lived child every 10 ms (churn).

    .venv/bin/python bench/run.py collector-slices   # BENCH_SLICES_S=N (default 30)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO  # noqa: E402  (bench/ is on sys.path)

SLICES_BPF = r"""
BPF_PERCPU_ARRAY(since, u64, 1);      /* when the task now on this CPU came on */
struct stat { u64 runs; u64 over_1ms; u64 max_ns; u64 total_ns; };
BPF_HASH(by_tid, u32, struct stat, 4096);
BPF_HISTOGRAM(hist, int, 40);         /* log2 of the slice in us */
BPF_HASH(queued, u32, u64, 65536);    /* tid -> when it became runnable */
struct behind { u64 waits; u64 over_1ms; u64 max_ns; u64 total_ns; };
BPF_ARRAY(behind, struct behind, 1);  /* others' waits that ended when the collector left the CPU */

static void runnable(u32 tid) {
    u64 now = bpf_ktime_get_ns();
    if (tid)
        queued.update(&tid, &now);
}
TRACEPOINT_PROBE(sched, sched_wakeup) { runnable(args->pid); return 0; }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { runnable(args->pid); return 0; }

TRACEPOINT_PROBE(sched, sched_switch) {
    int zero = 0;
    u64 now = bpf_ktime_get_ns();
    u64 *t = since.lookup(&zero);
    if (!t)
        return 0;
    u64 began = *t;
    *t = now;
    if ((args->prev_state & ~(long)0x100) == 0)   /* preempted (TASK_REPORT_MAX): runnable from now */
        runnable(args->prev_pid);
    u32 next = args->next_pid;
    u64 *q = queued.lookup(&next);
    u64 waited = q ? now - *q : 0;
    if (q)
        queued.delete(&next);
    if ((bpf_get_current_pid_tgid() >> 32) != TGID || began == 0 || args->prev_pid == 0)
        return 0;
    struct behind *b = behind.lookup(&zero);
    if (b && waited && next) {          /* it waited, and the collector held the CPU last */
        b->waits++;
        b->total_ns += waited;
        if (waited > 1000000) b->over_1ms++;
        if (waited > b->max_ns) b->max_ns = waited;
    }
    u64 d = now - began;
    u32 tid = args->prev_pid;
    struct stat zs = {};
    struct stat *s = by_tid.lookup_or_try_init(&tid, &zs);
    if (s) {
        s->runs++;
        s->total_ns += d;
        if (d > 1000000) s->over_1ms++;
        if (d > s->max_ns) s->max_ns = d;
    }
    hist.increment(bpf_log2l(d / 1000));
    return 0;
}
"""

STEPS = {  # Collector methods and probe methods whose CPU time is attributed
    "collector": ("update_targets", "refresh_own", "refresh_groups", "publish_histograms", "publish_stats",
                  "export_metrics", "publish_topology", "take_requests", "describe_process"),
    "probe": ("rescan", "poll", "periodic", "set_targets"),
}


def _timed(table: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            ns = time.thread_time_ns() - start
            row = table.setdefault(name, [0, 0, 0, 0])  # calls, over 1 ms, max ns, total ns
            row[0] += 1
            row[1] += ns > 1_000_000
            row[2] = max(row[2], ns)
            row[3] += ns
    return wrapper


def child_main(out: str, paced: bool = True, policy: str = "") -> None:
    """The collector, its steps timed; the table written at exit.
    ``paced=False``: the baseline, its pace points never yield. ``policy``:
    "idle" (SCHED_IDLE) or "nice10", set before any thread starts (threads
    inherit both); the kernel's drop count is kept for the table."""
    import atexit
    import runpy

    from jitterscope.collector import agent, pacing
    from jitterscope.collector.probes import interface, registry

    if not paced:
        pacing.PACER.budget_ns = 1 << 62
    if policy == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif policy == "nice10":
        os.setpriority(os.PRIO_PROCESS, 0, 10)
    table: dict = {}
    report_losses = agent.Collector.report_losses

    def losses(self, ringbuf, map_full):  # cumulative, every stats interval and at shutdown
        table["_losses"] = [ringbuf, map_full, self.events_read()]
        return report_losses(self, ringbuf, map_full)
    agent.Collector.report_losses = losses
    for name in STEPS["collector"]:
        setattr(agent.Collector, name, _timed(table, name, getattr(agent.Collector, name)))
    classes = {type(p) for p in registry.create(registry.enabled(agent.Settings()))} | {interface.LatencySignal}
    for cls in classes:
        for name in STEPS["probe"]:
            if name in cls.__dict__:
                setattr(cls, name, _timed(table, f"{cls.__name__}.{name}", cls.__dict__[name]))
    atexit.register(lambda: Path(out).write_text(json.dumps(table)))
    sys.argv = ["jitterscope", "collector"]
    runpy.run_module("jitterscope.cli", run_name="__main__")


def _host_load(tmp: Path, otlp_port: int, seconds: float) -> list[subprocess.Popen]:
    idle = [subprocess.Popen(["sleep", str(seconds + 60)]) for _ in range(300)]
    churn = subprocess.Popen(["bash", "-c", "while :; do /bin/true; sleep 0.01; done"])
    server = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "multiprocess_standin.py"), "--endpoint",
         f"http://127.0.0.1:{otlp_port}/v1/traces", "--requests", "1000000", "--seconds", str(seconds + 30),
         "--cpu-ms", "2", "--gap-ms", "20"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [*idle, churn, server]


def measure(seconds: float, paced: bool = True, extra_env: dict | None = None, policy: str = "",
            storm: int = 0) -> dict:
    """One run: the kernel's slices of the collector's threads and its steps' CPU times."""
    from bcc import BPF

    from jitterscope.broker import EmbeddedBroker, free_port

    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        otlp, steps = free_port(), Path(tmp) / "steps.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env.update(JITTERSCOPE_BOOTSTRAP_SERVERS=broker.bootstrap_servers, JITTERSCOPE_DATA_DIR=tmp,
                   JITTERSCOPE_HOST="slices", JITTERSCOPE_COLLECTOR_METRICS_PORT="0",
                   JITTERSCOPE_OTLP_PORT=str(otlp), PYTHONPATH=str(REPO / "bench"), **(extra_env or {}))
        log = Path(tmp) / "collector.log"
        collector = subprocess.Popen(
            [sys.executable, "-c", f"import collector_slices as c; c.child_main({str(steps)!r}, {paced}, {policy!r})"],
            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        load: list[subprocess.Popen] = []
        try:
            deadline = time.monotonic() + 180
            while b"collector started" not in log.read_bytes():
                assert collector.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            load = _host_load(Path(tmp), otlp, seconds)
            load += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(storm)]
            time.sleep(5)  # the server's first spans: its serving group found
            bpf = BPF(text=SLICES_BPF.replace("TGID", str(collector.pid)))
            time.sleep(seconds)
            threads = {}
            for tid, s in bpf["by_tid"].items():
                try:
                    name = Path(f"/proc/{collector.pid}/task/{tid.value}/comm").read_text().strip()
                except OSError:
                    name = "exited"
                threads[f"{name}/{tid.value}"] = {"runs": s.runs, "over_1ms": s.over_1ms,
                                                  "max_ms": s.max_ns / 1e6, "total_ms": s.total_ns / 1e6}
            hist = {2 ** k.value: v.value for k, v in bpf["hist"].items() if v.value}
            b = bpf["behind"][0]
            behind = {"waits": b.waits, "over_1ms": b.over_1ms, "max_ms": b.max_ns / 1e6, "total_ms": b.total_ns / 1e6}
            bpf.cleanup()
        finally:
            for p in load:
                p.kill()
            collector.terminate()
            collector.wait(60)
            for p in load:
                p.wait()
        table = json.loads(steps.read_text()) if steps.exists() else {}
    losses = table.pop("_losses", [0, 0, 0])
    return {"threads": threads, "hist_us": hist, "steps": table, "seconds": seconds, "behind": behind,
            "ringbuf_drops": losses[0], "map_full_drops": losses[1], "events_read": losses[2]}


def rows(result: dict, label: str) -> list[str]:
    threads = result["threads"]
    runs = sum(t["runs"] for t in threads.values())
    over = sum(t["over_1ms"] for t in threads.values())
    longest = max((t["max_ms"] for t in threads.values()), default=0.0)
    b = result["behind"]
    out = [f"| collector ({label}): others' waits that ended when it left the CPU | {b['waits']:,} waits, "
           f"{b['over_1ms']:,} over 1 ms ({b['over_1ms'] / result['seconds']:.2f}/s), longest {b['max_ms']:.1f} ms, "
           f"{b['total_ms'] / result['seconds']:.1f} ms waited/s | | |",
           f"| collector ({label}): on-CPU runs of all its threads, {result['seconds']:.0f} s | {runs:,} runs, "
           f"{over:,} over 1 ms ({over / result['seconds']:.2f}/s), longest {longest:.1f} ms | | |"]
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1]["max_ms"])[:6]:
        out.append(f"| — thread {name} | {t['runs']:,} runs, {t['over_1ms']:,} over 1 ms, longest "
                   f"{t['max_ms']:.2f} ms, {t['total_ms'] / result['seconds']:.1f} ms CPU/s | | |")
    for name, (calls, over1, max_ns, total_ns) in sorted(result["steps"].items(), key=lambda kv: -kv[1][2])[:12]:
        out.append(f"| — step {name} (main thread CPU time) | {calls:,} calls, {over1:,} over 1 ms, longest "
                   f"{max_ns / 1e6:.2f} ms, mean {total_ns / calls / 1e6:.3f} ms | | |")
    return out


def bench_collector_slices() -> str:
    """The collector with its pace points inert (the baseline), then paced, in one run."""
    seconds = float(os.environ.get("BENCH_SLICES_S", 30))
    results = {"unpaced": measure(seconds, paced=False), "paced": measure(seconds, paced=True)}
    Path(os.environ.get("BENCH_SLICES_JSON", "/tmp/collector_slices.json")).write_text(json.dumps(results))
    before, after = (results[k]["behind"] for k in ("unpaced", "paced"))
    ratio = (f"| waits over 1 ms behind the collector, paced / unpaced | "
             f"{after['over_1ms']:,} vs {before['over_1ms']:,} | "
             f"longest {after['max_ms']:.1f} vs {before['max_ms']:.1f} ms | "
             f"{after['over_1ms'] / max(before['over_1ms'], 1):.2f}x |")
    return "\n".join([*rows(results["unpaced"], "unpaced baseline"), *rows(results["paced"], "paced"), ratio])


def bench_collector_priority() -> str:
    """Does a lower priority lose events? The collector at its default
    priority, at nice 10 and at SCHED_IDLE, each under a CPU storm (a busy
    loop per CPU beside the same host load, a 0.5 ms run-queue threshold so
    the storm's waits become events), in one run: the kernel's drop counts,
    the events read, and others' waits behind the collector."""
    seconds = float(os.environ.get("BENCH_SLICES_S", 30))
    env = {"JITTERSCOPE_RUNQ_THRESHOLD_MS": "0.5"}
    out = []
    for policy in ("", "nice10", "idle"):
        r = measure(seconds, extra_env=env, policy=policy, storm=os.cpu_count() or 2)
        b = r["behind"]
        out.append(f"| collector at {policy or 'default priority'}, CPU storm, {seconds:.0f} s | events read "
                   f"{r['events_read']:,}, ring-buffer drops {r['ringbuf_drops']:,}, "
                   f"map-full {r['map_full_drops']:,} | "
                   f"others' waits over 1 ms ending as it left the CPU: {b['over_1ms']:,}, "
                   f"longest {b['max_ms']:.1f} ms | |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "bench"))
    print(bench_collector_slices())
