# SPDX-License-Identifier: Apache-2.0
"""Many hosts, many workers, one machine: three collectors, each in its own
network namespace and with its own host name, publish real run-queue events
to one broker on a bridge address; two streams workers in one consumer group
share the partitions, and one of them is killed (kill -9) and restarted
mid-run. Every host's records are stored exactly once -- counted against each
collector's own sent numbers -- alerts come from every host, and the
rebalance delay is measured.

Each worker here has its own embedded chDB (chDB admits one process per data
directory), where a fleet's workers share one ClickHouse. So "stored once" is
checked on the union of the two stores' record keys (host, boot_id, seq),
which is what a shared ClickHouse's ReplacingMergeTree keeps: a batch the
killed worker stored but had not committed is read again by the survivor and
lands in both stores -- at-least-once delivery, made exact by the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import zlib
from contextlib import ExitStack
from pathlib import Path

import pytest

from jitterscope.broker import EmbeddedBroker, free_port
from jitterscope.collector.agent import FINAL_FILE
from jitterscope.schemas import topics
from jitterscope.streams.clickhouse import TABLE_OF
from jitterscope.workload import last_cpu, starvation
from tests.conftest import Proc, Stack, make_stack, wait_until
from tests.netns import namespaces_on_a_bridge

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

HOSTS = 3
WORKERS = 2
LIVE_S = 4  # a host is "live" in a store that holds one of its records this recent (stats come every 1 s)
# the same port in every namespace (each has its own loopback), never a fixed
# one: a test binds no port that something else on the host may hold
OTLP_PORT = free_port()
REQUESTS = 200
STANDIN = Path(__file__).resolve().parents[2] / "examples/inference_standin.py"


def host_names(tag: str, count: int = HOSTS) -> list[str]:
    """Host names whose keys land on different partitions (librdkafka's default
    partitioner: CRC-32 of the key), so that any even split of the partitions
    between two workers gives each worker at least one host."""
    names: list[str] = []
    used: set[int] = set()
    i = 0
    while len(names) < count:
        name = f"{tag}-host{len(names)}-{i}"  # the tag first: queries select the run by prefix
        partition = zlib.crc32(name.encode()) % topics.PARTITIONS
        if partition not in used:
            used.add(partition)
            names.append(name)
        i += 1
    return names


def spawn_collector(stack: Stack, prefix: list[str], host: str, victim: str, data_dir) -> Proc:
    env = {**stack.env, "JITTERSCOPE_HOST": host, "JITTERSCOPE_DATA_DIR": str(data_dir),
           "JITTERSCOPE_TARGET_COMMS": json.dumps([victim]), "JITTERSCOPE_TARGET_RESCAN_S": "0.5",
           "JITTERSCOPE_HISTOGRAM_INTERVAL_S": "1", "JITTERSCOPE_OTLP_PORT": str(OTLP_PORT),
           "JITTERSCOPE_HARDWARE_PROBES": "[]"}  # the run-queue probe only: three BPF compiles are slow enough
    data_dir.mkdir()
    log = data_dir / "collector.log"
    popen = subprocess.Popen([*prefix, sys.executable, "-m", "jitterscope.cli", "collector"], env=env,
                             stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Proc(f"collector {host}", popen, log)


def serve_requests(prefix: list[str], host: str) -> subprocess.Popen:
    """An inference-server stand-in in the host's namespace, sending its
    request spans to that host's collector; it runs on the crowded CPU."""
    return subprocess.Popen(
        [*prefix, sys.executable, str(STANDIN), "--endpoint", f"http://127.0.0.1:{OTLP_PORT}/v1/traces",
         "--requests", str(REQUESTS), "--cpu-ms", "2", "--gap-ms", "50", "--id-prefix", f"{host}-",
         "--pin-cpu", str(last_cpu()), "--times"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def live_hosts(store: Stack, tag: str, since_ns: int | None = None) -> set[str]:
    """Hosts whose stats records from after ``since_ns`` (default: the last
    LIVE_S seconds) this worker has stored: the partitions it owns now."""
    since_ns = since_ns or time.time_ns() - LIVE_S * 1_000_000_000
    try:
        rows = store.query("SELECT DISTINCT host FROM jitterscope.collector_stats WHERE startsWith(host, {t:String}) "
                           "AND ts > fromUnixTimestamp64Nano({s:Int64})", t=tag, s=since_ns)
    except Exception:  # a worker still starting (or just killed) owns nothing
        return set()
    return {host for host, in rows}


def stored_keys(store: Stack, tag: str) -> dict[tuple[str, str], set[tuple[str, int]]]:
    """(host, topic) -> the record keys this store holds."""
    sql = " UNION ALL ".join(
        f"SELECT '{topic}' AS topic, host, boot_id, seq FROM jitterscope.{TABLE_OF[record_type]} FINAL "
        "WHERE startsWith(host, {t:String})" for topic, record_type in topics.INPUT_TOPICS.items())
    keys: dict[tuple[str, str], set[tuple[str, int]]] = {}
    for topic, host, boot_id, seq in store.query(sql, t=tag):
        keys.setdefault((host, topic), set()).add((boot_id, int(seq)))
    return keys


def union(stores: list[Stack], tag: str) -> dict[tuple[str, str], set]:
    merged: dict[tuple[str, str], set] = {}
    for store in stores:
        for key, seqs in stored_keys(store, tag).items():
            merged.setdefault(key, set()).update(seqs)
    return merged


def counts(keys: dict[tuple[str, str], set], host: str) -> dict[str, int]:
    return {topic: len(seqs) for (h, topic), seqs in keys.items() if h == host and seqs}


def attributions(stores: list[Stack], tag: str) -> dict[str, int]:
    """host -> requests attributed, over both stores (one key per request)."""
    keys: dict[str, set] = {}
    for store in stores:
        for host, boot_id, seq in store.query(
                "SELECT host, boot_id, seq FROM jitterscope.request_attribution FINAL "
                "WHERE startsWith(host, {t:String})", t=tag):
            keys.setdefault(host, set()).add((boot_id, seq))
    return {host: len(k) for host, k in keys.items()}


def start_workers(workers: list[Stack]) -> list[Proc]:
    """Spawned together, then waited for: their start-ups overlap."""
    procs = [w.spawn("streams", "streams") for w in workers]
    for w, proc in zip(workers, procs):
        wait_until(w.query_ok, 240, f"streams worker answering on {w.web_port}", proc)
    return procs


def test_three_hosts_two_workers_one_killed_stores_every_record_once(tmp_path):
    tag = f"mh{uuid.uuid4().hex[:6]}"
    hosts = host_names(tag)
    victims = [f"jsv{i}{tag[2:]}" for i in range(HOSTS)]  # a comm of 15 characters at most
    cpus = os.sched_getaffinity(0)
    # the start-ups (three BPF compiles, two chDB imports) may use every CPU;
    # the test keeps itself off the last one, where the starvation runs
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    try:
        with ExitStack() as cleanup:
            ns = cleanup.enter_context(namespaces_on_a_bridge(HOSTS))
            broker = cleanup.enter_context(EmbeddedBroker(host=ns.bridge_ip, log_file=tmp_path / "broker.log"))
            workers = [make_stack(broker, tmp_path / f"worker{i}") for i in range(WORKERS)]
            for w in workers:
                w.data_dir.mkdir()
                w.env["JITTERSCOPE_ATTRIBUTION_GRACE_S"] = "0.5"
                cleanup.callback(w.stop_all)
            collectors = [spawn_collector(workers[0], ns.prefix(i), hosts[i], victims[i], tmp_path / f"collector{i}")
                          for i in range(HOSTS)]
            for c in collectors:
                cleanup.callback(c.stop)
            worker_procs = start_workers(workers)
            for c in collectors:
                wait_until(lambda: "collector started" in c.text(), 240, "collector start", c)
            for c in collectors:  # the receiver starts after the probes: the stand-ins need it
                wait_until(lambda: "OTLP receiver listening" in c.text(), 120, "the OTLP receiver", c)
            os.sched_setaffinity(0, cpus)

            loads = [cleanup.enter_context(starvation(seconds=600, hogs=2, delay=0, name=v)) for v in victims]
            # both workers store live records of different hosts: they share the
            # partitions (while a rebalance is in flight a host is live in both)
            seen: list = []

            def shared() -> list[set[str]] | None:
                seen[:] = live = [live_hosts(w, tag) for w in workers]
                return live if all(live) and not live[0] & live[1] and live[0] | live[1] == set(hosts) else None

            try:
                owners = wait_until(shared, 180, "both workers storing live records of different hosts")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; live hosts per worker: {seen}") from None

            servers = [serve_requests(ns.prefix(i), hosts[i]) for i in range(HOSTS)]  # across the kill
            for server in servers:
                cleanup.callback(server.kill)

            # kill -9 the worker that owns fewest hosts; the survivor must take them over
            k = min(range(WORKERS), key=lambda i: len(owners[i]))
            survivor = workers[1 - k]
            taken = owners[k]
            killed_ns = time.time_ns()
            killed_at = time.monotonic()
            os.kill(worker_procs[k].popen.pid, signal.SIGKILL)
            worker_procs[k].popen.wait()
            wait_until(lambda: taken <= live_hosts(survivor, tag, killed_ns), 180,
                       f"the surviving worker storing {sorted(taken)}'s new records", worker_procs[1 - k])
            rebalance_s = time.monotonic() - killed_at

            restarted_ns = time.time_ns()
            restarted_at = time.monotonic()
            worker_procs[k] = start_workers([workers[k]])[0]
            back = wait_until(lambda: live_hosts(workers[k], tag, restarted_ns), 180,
                              "the restarted worker storing new records again", worker_procs[k])
            rejoin_s = time.monotonic() - restarted_at

            for server, c in zip(servers, collectors):
                out, _ = server.communicate(timeout=180)
                assert server.returncode == 0 and len(out.splitlines()) == REQUESTS, (
                    f"{out[-2000:]}\n{c.name} ({'running' if c.popen.poll() is None else c.popen.returncode}):\n"
                    f"{c.text()[-3000:]}")
            for load in loads:  # the victims end; starvation's exit ends their hogs
                load.kill()
            for c in collectors:  # all at once; a second SIGTERM would cut a shutdown short
                c.popen.send_signal(signal.SIGTERM)
            for c in collectors:
                assert c.popen.wait(60) == 0, c.text()[-3000:]
            finals = {hosts[i]: json.loads((tmp_path / f"collector{i}" / FINAL_FILE).read_text())
                      for i in range(HOSTS)}
            sent = {h: {t: n for t, n in f["sent_by_topic"].items() if n} for h, f in finals.items()}
            for h, f in finals.items():
                assert f["host"] == h and f["undelivered"] == 0 and f["spooled"] == 0, f
                assert sent[h].get(topics.RUNQ, 0) > 0, f"no run-queue events sent by {h}: {f}"
                assert sent[h].get(topics.REQUESTS) == REQUESTS, f"{h} got its own namespace's spans: {f}"

            every = wait_until(lambda: (u := union(workers, tag)) and all(counts(u, h) == sent[h] for h in hosts)
                               and u, 180, f"every host's records stored: {sent}", worker_procs[1 - k],
                               interval=2)
            per_store = [stored_keys(w, tag) for w in workers]
            for h in hosts:
                assert counts(every, h) == sent[h]
            for h in taken:  # before the kill in one store, after it in the other
                assert all(counts(s, h).get(topics.COLLECTOR_STATS) for s in per_store), h
            both = sum(len(seqs & per_store[1].get(key, set())) for key, seqs in per_store[0].items())

            attributed = wait_until(
                lambda: (n := attributions(workers, tag)) and all(n.get(h) == REQUESTS for h in hosts) and n, 120,
                "every request attributed", worker_procs[1 - k], interval=2)
            alerts = [dict(w.query("SELECT host, count() FROM jitterscope.alerts WHERE startsWith(host, {t:String}) "
                                   "GROUP BY host", t=tag)) for w in workers]
            alerts_by_host = {h: sum(a.get(h, 0) for a in alerts) for h in hosts}
            assert all(alerts_by_host.values()), f"alerts by host: {alerts_by_host}"
    finally:
        os.sched_setaffinity(0, cpus)

    print(f"\n[measured] {HOSTS} collectors in network namespaces, {WORKERS} workers in one group, "
          f"worker {k} (owning {sorted(taken)}) killed -9 and restarted")
    for h in hosts:
        print(f"  {h}: sent {sum(sent[h].values()):,} records ({sent[h]}), stored once: "
              f"{sum(counts(every, h).values()):,}; requests attributed {attributed[h]}; alerts {alerts_by_host[h]}")
    print(f"  rebalance: the survivor stored the killed worker's hosts' new records {rebalance_s:.1f} s after "
          f"the kill; the restarted worker stored new records {rejoin_s:.1f} s after its restart "
          f"(hosts {sorted(back)}); {both:,} records stored by both workers (redelivered, one key)")
