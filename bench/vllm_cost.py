# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py vllm-cost`: what watching costs a real vLLM on this box
(issue 39's first goal). A real vLLM V1 on the CPU (`make test-vllm`'s venv
and tiny model, examples/vllm_cpu.py) serves one completion after another
(16 tokens, closed loop, as the client sees them), in phases of PHASE_S
alternating, the order turned each round:

- ``off``: nothing of jitterscope runs (vLLM's spans go to a port no one
  listens on);
- ``collector``: the collector alone (every default signal, its OTLP
  receiver taking vLLM's spans), publishing to an embedded broker started
  once for the bench: what stays on every GPU host of a fleet;
- ``up``: the whole `jitterscope up` on the same 2 CPUs (broker, judge,
  attribution, store, collector), whose attributions then say how many
  requests named jitterscope's own processes their top culprit;
- ``up-nice`` (asked for in BENCH_VLLM_ARMS): the same, its attribute-store
  at nice 10 (``up_background_nice``).

Each arm's P50/P99 are over its phases' requests together; the ratios are
against ``off`` in the same run. The start of each collector (BPF compile)
and `up`, and the SETTLE_S after it, are not in a phase (a first run of this
bench counted the collector's first seconds in: P99 2.75x for the collector
alone against 1.47x for the whole `up`, whose start waits longer).

    .venv/bin/python bench/run.py vllm-cost     # BENCH_VLLM_ROUNDS (2), BENCH_VLLM_PHASE_S (45),
                                                # BENCH_VLLM_ARMS (off,collector,up; or up-nice, collector-nostacks,
                                                # collector-batch, collector-idle), BENCH_VLLM_STEPS=1
                                                # (the collector's steps' CPU, as collector-slices times them)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from alert_delay import _pct, running_up  # noqa: E402  (bench/ is on sys.path)
from overhead import collector_of  # noqa: E402
from common import REPO  # noqa: E402  (bench/ is on sys.path)

sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO))
from vllm_cpu import serve_command  # noqa: E402

VENV = Path(os.environ.get("JITTERSCOPE_VLLM_VENV", REPO / ".venv-vllm"))
MODEL = VENV / "tiny-llama"
ROUNDS = int(os.environ.get("BENCH_VLLM_ROUNDS", "2"))
PHASE_S = float(os.environ.get("BENCH_VLLM_PHASE_S", "45"))
#: requests after a start that no phase counts: a collector's first seconds (every process described,
#: vLLM's Python runtimes found, its blocked probe set up) are its start-up, not its steady cost
SETTLE_S = float(os.environ.get("BENCH_VLLM_SETTLE_S", "15"))
CLI = [sys.executable, "-m", "jitterscope.cli"]
OWN_BROKER = os.environ.get("BENCH_VLLM_OWN_BROKER", "1") == "1"
ARMS = os.environ.get("BENCH_VLLM_ARMS", "off,collector,up").split(",")  # "off" is always run: the baseline
STEPS = os.environ.get("BENCH_VLLM_STEPS", "") == "1"
#: the collector's arms: what the table says, its settings beyond the defaults
VARIANTS = {"collector": ("the collector alone", {}),
            "collector-nostacks": ("the collector alone, no stacks (runq_stacks false)",
                                   {"JITTERSCOPE_RUNQ_STACKS": "false"}),
            "collector-batch": ("the collector alone under SCHED_BATCH (collector_policy batch)",
                                {"JITTERSCOPE_COLLECTOR_POLICY": "batch"}),
            "collector-idle": ("the collector alone under SCHED_IDLE (collector_policy idle)",
                               {"JITTERSCOPE_COLLECTOR_POLICY": "idle"})}
#: the whole `up`'s arms: what the table says, its settings beyond the defaults
UP_VARIANTS = {"up": ("the whole `up` (broker, judge, attribute-store, collector)", {}),
               "up-nice": ("the whole `up`, its attribute-store at nice 10 (up_background_nice)",
                           {"JITTERSCOPE_UP_BACKGROUND_NICE": "10"})}


def _phase(api_port: int, seconds: float, prefix: str) -> list[float]:
    from tests.vllm.test_real_vllm import complete

    latencies, end, i = [], time.monotonic() + seconds, 0
    while time.monotonic() < end:
        start, finish = complete(api_port, f"{prefix}{i}")
        latencies.append((finish - start) / 1e9)
        i += 1
    return latencies


def _cpu_s(pid: int) -> float:
    """CPU time (user + system) a process and its living children (the
    collector's symbolizing helper) have used, in s."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(_cpu_s(c) for c in children)


def _measured(api_port: int, prefix: str, collector: int) -> tuple[list[float], float]:
    """A phase's latencies, and the collector's CPU share over it (of one CPU)."""
    cpu, began = _cpu_s(collector), time.monotonic()
    latencies = _phase(api_port, PHASE_S, prefix)
    return latencies, (_cpu_s(collector) - cpu) / (time.monotonic() - began)


def _losses(log: Path) -> str:
    """What the collector's log says it read and the kernel lost (its stop line, its last loss line), and
    when it lost them (s after its "collector started" line: while its probes were still being set up?)."""
    lines = [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    at = {line["msg"]: line["ts"] for line in lines}
    read = [line["events_read"] for line in lines if "events_read" in line]
    lost = [(line["ts"], line["ringbuf_drops"]) for line in lines if "ringbuf_drops_total" in line]
    started = datetime.fromisoformat(at.get("collector started", lines[0]["ts"]).replace("Z", "+00:00"))
    when = ", ".join(f"{n} at {(datetime.fromisoformat(ts.replace('Z', '+00:00')) - started).total_seconds():+.0f} s"
                     for ts, n in lost)
    return f"events read {read[-1] if read else '?'}, ring-buffer drops {sum(n for _, n in lost)} ({when or 'none'})"


def _collector_phase(broker, otlp: int, api_port: int, prefix: str,
                     extra: dict | None = None) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory() as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
        env.update(JITTERSCOPE_DATA_DIR=data, JITTERSCOPE_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
                   JITTERSCOPE_OTLP_PORT=str(otlp), JITTERSCOPE_COLLECTOR_METRICS_PORT="0",
                   JITTERSCOPE_HOST=f"vllm-cost-{os.getpid()}",
                   # the bench's broker stands for a fleet's Kafka, which is not on the GPU host: as under
                   # `up`, it is jitterscope's own, not a neighbour whose stacks the collector reads and
                   # symbolizes whenever a vLLM thread waits behind it. Its own tree, not this process's:
                   # vLLM is this process's child too (a first version counted vLLM as jitterscope's own,
                   # so the collector dropped its waits instead of publishing them)
                   JITTERSCOPE_OWN_TREE_PID=str(broker.proc.pid) if OWN_BROKER else "0", **(extra or {}))
        log, steps = Path(data) / "collector.log", Path(data) / "steps.json"
        command = [*CLI, "collector"]
        if STEPS:  # its loop's steps timed in thread CPU time (bench/collector_slices.py), printed after
            env["PYTHONPATH"] = str(REPO / "bench")
            command = [sys.executable, "-c", f"import collector_slices as c; c.child_main({str(steps)!r})"]
        collector = subprocess.Popen(command, env=env, cwd=data, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while "collector started" not in log.read_text(errors="replace"):
                assert collector.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            _phase(api_port, SETTLE_S, f"settle-{prefix}")
            return _measured(api_port, prefix, collector.pid)
        finally:
            collector.terminate()
            collector.wait(60)
            print(f"<!-- {prefix} {_losses(log)} -->", file=sys.stderr, flush=True)
            if steps.exists():
                table = {k: v for k, v in json.loads(steps.read_text()).items() if not k.startswith("_")}
                for name, (calls, over1, max_ns, total_ns) in sorted(table.items(), key=lambda kv: -kv[1][3])[:10]:
                    print(f"<!-- {prefix} step {name}: {calls} calls, {over1} over 1 ms, "
                          f"longest {max_ns / 1e6:.1f} ms, total {total_ns / 1e6:.0f} ms -->",
                          file=sys.stderr, flush=True)


def _up_phase(otlp: int, api_port: int, prefix: str, settings: dict) -> tuple[list[float], float, dict[str, int]]:
    with running_up(None, {"JITTERSCOPE_OTLP_PORT": str(otlp), **settings}) as run:
        _phase(api_port, SETTLE_S, f"settle-{prefix}")
        latencies, share = _measured(api_port, prefix, collector_of(run.up.pid))
        time.sleep(6)  # the last requests' attribution
        run.stop()
        rows = run.query(
            "SELECT count(), countIf(startsWith(culprit, 'jitterscope:')), "
            "countIf(startsWith(culprit, 'jitterscope:collector')) FROM jitterscope.request_attribution FINAL "
            f"WHERE startsWith(request_id, 'cmpl-{prefix}')")
    requests, own, collector = (int(v) for v in rows[0])
    return latencies, share, {"attributed": requests, "own": own, "collector": collector}


@contextmanager
def serving_vllm(otlp: int):
    """A real vLLM V1 on the CPU, its spans sent to ``otlp``, warmed up; its API port."""
    from jitterscope.broker import free_port
    from tests.vllm.test_real_vllm import ready

    if not (VENV / "bin" / "vllm").exists():
        raise SystemExit(f"no vLLM venv at {VENV}: `make test-vllm` installs it and its model")
    api_port = free_port()
    argv, env = serve_command(VENV, MODEL, api_port, f"http://127.0.0.1:{otlp}/v1/traces")
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while not ready(api_port):
                assert server.poll() is None and time.monotonic() < deadline, "vLLM did not start"
                time.sleep(1)
            _phase(api_port, 10, "warm")  # its first requests compile and allocate
            yield api_port
        finally:
            os.killpg(server.pid, 9)
            server.wait()


def bench_vllm_cost() -> str:
    from jitterscope.broker import EmbeddedBroker, free_port

    otlp = free_port()
    with EmbeddedBroker() as broker, serving_vllm(otlp) as api_port:
        latencies: dict[str, list[float]] = {arm: [] for arm in ("off", *VARIANTS, *UP_VARIANTS)}
        own = {arm: {"attributed": 0, "own": 0, "collector": 0} for arm in UP_VARIANTS}
        shares: dict[str, list[float]] = {arm: [] for arm in latencies}
        arms = ["off", *(a for a in ARMS if a in latencies and a != "off")]
        for r in range(ROUNDS):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                prefix = f"{arm}{r}-"
                share = 0.0
                if arm == "off":
                    got = _phase(api_port, PHASE_S, prefix)
                elif arm in VARIANTS:
                    got, share = _collector_phase(broker, otlp, api_port, prefix, VARIANTS[arm][1])
                else:
                    got, share, counts = _up_phase(otlp, api_port, prefix, UP_VARIANTS[arm][1])
                    own[arm] = {k: own[arm][k] + counts[k] for k in own[arm]}
                latencies[arm] += got
                shares[arm].append(share)
                d = sorted(got)
                print(f"<!-- round {r} {arm}: {len(d)} requests, p50 {_pct(d, 0.5) * 1e3:.0f} ms, "
                      f"p99 {_pct(d, 0.99) * 1e3:.0f} ms, "
                      f"the collector's CPU (its helper's too) {share:.1%} of one -->",
                      file=sys.stderr, flush=True)

    def figures(arm: str) -> tuple[str, float, float]:
        d = sorted(latencies[arm])
        return (f"P50 {_pct(d, 0.5) * 1e3:,.0f} ms, P99 {_pct(d, 0.99) * 1e3:,.0f} ms ({len(d):,} requests)",
                _pct(d, 0.5), _pct(d, 0.99))

    base, base50, base99 = figures("off")
    rows = []
    for arm, what in ((a, v[0]) for a, v in {**VARIANTS, **UP_VARIANTS}.items()):
        if not latencies[arm]:
            continue
        text, p50, p99 = figures(arm)
        rows.append(f"| a real vLLM V1 on the CPU, {ROUNDS} rounds of {PHASE_S:.0f} s phases alternating: "
                    f"with {what} | {text}; the collector's CPU {sum(shares[arm]) / len(shares[arm]):.1%} of one | "
                    f"nothing of jitterscope: {base} | P50 {p50 / base50:.2f}x, P99 {p99 / base99:.2f}x |")
    for arm, counts in own.items():
        if counts["attributed"]:
            share = lambda n: f"{n / counts['attributed']:.1%}"  # noqa: E731
            rows.append(f"| of the `{arm}` phases' requests attributed ({counts['attributed']:,}), top culprit "
                        f"jitterscope's own | {counts['own']:,} ({share(counts['own'])}), the collector "
                        f"{counts['collector']:,} ({share(counts['collector'])}) | goal: ≤ 5%, the collector ≤ 1% | |")
    return "\n".join(rows)
