# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py alert-delay-loaded`: issue 39's alert-delay goal as written.
The demo's starvation storm (a victim and 3 CPU hogs on one CPU, as
`alert-delay`) for LOADED_S under `jitterscope up` *while*

- a real vLLM V1 on the CPU serves completions in a closed loop on the same
  host, its spans to up's OTLP receiver, every request over a 1 ms TTFT
  objective (so each one raises `request_slo`), and
- MIX_HOSTS vLLM-shaped hosts (bench/vllm_mix.py) send their records into
  up's broker, paced at their own rate, through the same stages.

Baseline, same run: the storm alone under `up` for BASE_S (no vLLM, no mix).
Reported: the storm's run-queue alert delay (raised − wait end; p50, p99,
max) and the worst second's p99; the real vLLM's `request_slo` delay
(first raise − request end); the judge's loop lag from its histogram; the
mix's records sent, and stored by the time `up` stopped.

    .venv/bin/python bench/run.py alert-delay-loaded   # BENCH_LOADED_S (300), BENCH_BASE_S (60),
                                                       # BENCH_MIX_HOSTS (2), BENCH_UP_SETTINGS
                                                       # ('{"JITTERSCOPE_UP_BACKGROUND_NICE": "10"}')
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

from alert_delay import QUIET_S, _metrics, _pct, quantiles_ms, running_up, storm  # noqa: E402
from jitterscope.schemas.topics import RUNQ
from mix import TABLES, TICK_S  # noqa: E402  (bench/ is on sys.path)
from vllm_cost import _phase, serving_vllm  # noqa: E402

LOADED_S = float(os.environ.get("BENCH_LOADED_S", "300"))
BASE_S = float(os.environ.get("BENCH_BASE_S", "60"))
MIX_HOSTS = int(os.environ.get("BENCH_MIX_HOSTS", "2"))
MIX_PREFIX = "loadmix"
#: settings of both runs' `up` beyond its defaults, as environment variables (a JSON object)
UP_SETTINGS = json.loads(os.environ.get("BENCH_UP_SETTINGS", "{}"))


def _send_mix(bootstrap: str, stop: threading.Event, sent: list[int]) -> None:
    """MIX_HOSTS vLLM-shaped hosts' records into ``bootstrap``, paced tick by tick until ``stop``."""
    import vllm_mix
    from confluent_kafka import Producer

    from jitterscope.schemas import batches

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5})
    hosts = [f"{MIX_PREFIX}{h}" for h in range(MIX_HOSTS)]
    for host in hosts:
        for topic, records in vllm_mix.setup_records(host, time.time_ns()):
            producer.produce(topic, batches.encode_batch(records), key=host.encode())
    mixes = [vllm_mix.VllmMix(host, TICK_S) for host in hosts]
    start, tick = time.time(), 0
    while not stop.is_set():
        wait = start + tick * TICK_S - time.time()
        if wait > 0:
            time.sleep(wait)
        for mix in mixes:
            for topic, records in mix.tick(tick, time.time_ns()):
                while True:
                    try:
                        producer.produce(topic, batches.encode_batch(records), key=mix.host.encode())
                        break
                    except BufferError:
                        producer.poll(0.01)
                sent[0] += len(records)
        producer.poll(0)
        tick += 1
    producer.flush(60)


def _broker_round_trips(bootstrap: str, stop: threading.Event, out: list[float]) -> None:
    """Produce a small message every 0.1 s to a topic of the bench's own, and time each until a consumer
    has it (s): the broker's share of an alert's delay, as a client beside the collector sees it."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"bench.roundtrip.{os.getpid()}"
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "fetch.wait.max.ms": 10,
                         "enable.auto.commit": False})
    producer.produce(topic, b"start", partition=0)
    producer.flush(30)
    consumer.assign([TopicPartition(topic, 0, 0)])  # no group to join: the first fetch is the first message
    next_at, started = 0.0, False
    while not stop.is_set():
        if started and time.monotonic() >= next_at:
            producer.produce(topic, str(time.time()).encode(), partition=0)
            producer.poll(0)
            next_at = time.monotonic() + 0.1
        message = consumer.poll(0.02)
        if message is None or message.error():
            continue
        if message.value() == b"start":
            started = True
        else:
            out.append(time.time() - float(message.value()))
    consumer.close()


def _histogram(text: str, name: str, **wanted: str) -> str:
    """A histogram on /metrics, its series with the ``wanted`` labels summed: observations, mean, and
    the bucket its p50 and p99 fall in."""
    series: dict[str, list[tuple[dict, float]]] = {}
    for part, labels, value in re.findall(rf"^{name}_(\w+)\{{([^}}]*)\}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if all(found.get(k) == v for k, v in wanted.items()):
            series.setdefault(part, []).append((found, float(value)))
    count = sum(v for _, v in series.get("count", []))
    if not count:
        return "none"
    total = sum(v for _, v in series.get("sum", []))
    buckets: dict[float, float] = {}
    for labels, v in series.get("bucket", []):
        if labels["le"] != "+Inf":
            buckets[float(labels["le"])] = buckets.get(float(labels["le"]), 0.0) + v

    def bucket(q: float) -> str:
        return next((f"≤ {le * 1e3:,g} ms" for le, n in sorted(buckets.items()) if n >= q * count), "beyond")
    return f"{count:,.0f}, mean {total / count * 1e3:,.1f} ms, p50 {bucket(0.5)}, p99 {bucket(0.99)}"


def _cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``pid`` and each process below it, by command line (the stages told apart)."""
    from tests.integration.test_first_hour import descendants

    out: dict[str, float] = {}
    for child in descendants(pid):
        try:
            args = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = " ".join(a.decode(errors="replace") for a in args[-3:] if a).rsplit("/", 1)[-1][:40]
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _worst_second_p99(rows: list[tuple[float, float]]) -> float:
    """The largest per-second p99 of (delay s, wait end ns) rows."""
    seconds: dict[int, list[float]] = {}
    for delay, ts in rows:
        seconds.setdefault(int(ts // 1e9), []).append(delay)
    return max((_pct(sorted(d), 0.99) for d in seconds.values()), default=float("nan"))


def _run(seconds: float, otlp: int, api_port: int | None = None) -> dict:
    """One `up` with the storm; with ``api_port`` (a real vLLM's, its spans sent to ``otlp``), its client
    and the mix too."""
    from jitterscope.broker import free_port

    loaded, judge, collector = api_port is not None, free_port(), free_port()
    settings = {"JITTERSCOPE_OTLP_PORT": str(otlp), "JITTERSCOPE_TTFT_SLO_MS": json.dumps({"*": 1}),
                "JITTERSCOPE_JUDGE_WEB_PORT": str(judge), "JITTERSCOPE_COLLECTOR_METRICS_PORT": str(collector),
                **UP_SETTINGS}
    with running_up(None, settings) as run:
        bootstrap = next(re.search(r"Kafka (\S+?);", line)[1] for line in run.lines if "Kafka " in line)
        stop, sent, latencies, trips = threading.Event(), [0], [], []
        helpers = []
        if loaded:
            helpers = [threading.Thread(target=_send_mix, args=(bootstrap, stop, sent)),
                       threading.Thread(target=_broker_round_trips, args=(bootstrap, stop, trips)),
                       threading.Thread(target=lambda: latencies.extend(_phase(api_port, seconds, "loaded-")))]
            for helper in helpers:
                helper.start()
        cpu_before, began = _cpu_by_process(run.up.pid), time.monotonic()
        pids = storm(seconds)
        cpu = {name: (s - cpu_before.get(name, 0.0)) / (time.monotonic() - began)
               for name, s in _cpu_by_process(run.up.pid).items()}
        print(f"<!-- CPU of one over the storm: {', '.join(f'{n} {v:.0%}' for n, v in sorted(cpu.items()))} -->",
              file=sys.stderr, flush=True)
        stop.set()
        for helper in helpers:
            helper.join()
        time.sleep(QUIET_S)  # the last alerts and attributions
        text = _metrics(judge)
        held = _histogram(_metrics(collector), "jitterscope_collector_batch_age_seconds", topic=RUNQ)
        run.stop()
        if os.environ.get("BENCH_KEEP_LOGS"):  # up's processes' logs, for a run to be read afterwards
            kept = Path(os.environ["BENCH_KEEP_LOGS"]) / ("loaded" if loaded else "alone")
            kept.mkdir(parents=True, exist_ok=True)
            for log in Path(run.data).glob("*.log"):
                shutil.copy(log, kept / log.name)
        pid_list = ", ".join(map(str, sorted(pids)))
        rows = [(r[0], r[1]) for r in run.query(
            "SELECT (toUnixTimestamp64Nano(raised) - toUnixTimestamp64Nano(ts)) / 1e9, toUnixTimestamp64Nano(ts) "
            f"FROM jitterscope.alerts WHERE kind = 'runq_starvation' AND pid IN ({pid_list})")]
        requests = sorted(r[0] for r in run.query(
            "SELECT (min(toUnixTimestamp64Nano(raised)) - any(toUnixTimestamp64Nano(ts))) / 1e9 "
            f"FROM jitterscope.alerts WHERE kind = 'request_slo' AND host NOT LIKE '{MIX_PREFIX}%' "
            "GROUP BY host, boot_id, seq"))
        stored = sum(int(run.query(f"SELECT count() FROM jitterscope.{t} WHERE host LIKE '{MIX_PREFIX}%'")[0][0])
                     for t in TABLES) if loaded else 0
    lag = (f"the collector's run-queue batches' age when produced {held}; "
           f"loop lag {_histogram(text, 'jitterscope_streams_loop_lag_seconds', stage='judge')}; run-queue "
           f"messages' age when taken {_histogram(text, 'jitterscope_streams_message_age_seconds', topic=RUNQ)}")
    if trips:
        lag += f"; a client's broker round trips {quantiles_ms(sorted(trips))} ({len(trips)})"
    return {"delays": sorted(r[0] for r in rows), "rows": rows, "requests": requests, "lag": lag,
            "sent": sent[0], "stored": stored, "served": sorted(latencies), "summary": run.summary()}


def bench_alert_delay_loaded() -> str:
    from jitterscope.broker import free_port

    otlp = free_port()
    base = _run(BASE_S, otlp)
    print(f"<!-- storm alone: {len(base['delays'])} alerts, {quantiles_ms(base['delays'])}; {base['lag']} -->",
          file=sys.stderr, flush=True)
    with serving_vllm(otlp) as api_port:
        loaded = _run(LOADED_S, otlp, api_port)

    def row(result: dict) -> str:
        d = result["delays"]
        return (f"{quantiles_ms(d)}, max {d[-1] * 1e3 if d else float('nan'):,.0f} ms ({len(d):,} alerts); "
                f"worst second's p99 {_worst_second_p99(result['rows']) * 1e3:,.0f} ms; judge {result['lag']}")

    served = loaded["served"]
    return "\n".join([
        f"| run-queue alert delay (raised − wait end), the demo storm for {LOADED_S:.0f} s under `up` while a real "
        f"vLLM serves on the host ({len(served):,} requests, P50 {_pct(served, 0.5) * 1e3:.0f} ms, P99 "
        f"{_pct(served, 0.99) * 1e3:.0f} ms) and {MIX_HOSTS} vLLM-shaped hosts' records flow through "
        f"({loaded['sent'] / LOADED_S:,.0f} records/s sent, {loaded['stored']:,} of {loaded['sent']:,} stored "
        f"at stop) | {row(loaded)} | the storm alone for {BASE_S:.0f} s: {row(base)} | p99 "
        f"{_pct(loaded['delays'], 0.99) / _pct(base['delays'], 0.99):.2f}x |",
        f"| `request_slo` alert delay (first raise − request end) of the real vLLM's requests, the same run | "
        f"{quantiles_ms(loaded['requests'])}, max {loaded['requests'][-1] * 1e3 if loaded['requests'] else 0:,.0f} "
        f"ms ({len(loaded['requests']):,} alerts) | goal: p99 ≤ 1,000 ms | |"])
