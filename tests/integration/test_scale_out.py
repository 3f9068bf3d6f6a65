# SPDX-License-Identifier: Apache-2.0
"""Scaling out by stage (streams/stages.py, streams/attribution_stage.py),
with a real broker and chDB: two judge processes and two attribution
processes share the partitions of four hosts (one per partition), one store
(chDB admits one process per data directory; a fleet's stores share a
ClickHouse server), and one judge and one attribution process are killed
(kill -9) mid-stream. Requests, their kernel evidence and the serving
processes' records flow live all along.

- **nothing lost:** every request sent is attributed and stored;
- **nothing attributed twice:** each request appears once on the
  attribution topic (the survivor re-reads what the killed process
  published, and does not attribute those again) and once in the store;
- **no request attributed differently than with one process:** each
  attribution equals what one attributor fed every record gives (the same
  code a single process runs, here in the test), baselines included: the
  survivor rebuilt them from the published attributions;
- the hosts of the killed judge are judged again: their late waits alert.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import types
import uuid
from collections import Counter

import msgspec
import pytest
from confluent_kafka import Producer

from jitterscope.broker import EmbeddedBroker, free_port
from jitterscope.common.settings import load
from jitterscope.schemas import events, topics
from jitterscope.streams.app import StreamsWorker
from jitterscope.streams.host_state import HostState
from tests.conftest import Proc, make_stack, records_on_topic, wait_until
from tests.integration.test_many_hosts import host_names
from tests.integration.test_stages import metrics
from tests.integration.test_streams_faults import example, lines

pytestmark = pytest.mark.integration

HOSTS = 4
ROUNDS = 70  # one request per host per round
ROUND_S = 0.4
KILL_AT = 25  # the round after which one judge and one attribution process die
SERVING_PID = 4242
#: what the attribution compares: everything the attributor decides
COMPARED = ("cause", "culprit", "excess_ns", "baseline_ns", "explained", "runq_wait_ns", "runq_wait_max_ns",
            "runq_waits", "suspects", "slo_ns", "slo_breached", "service_ns")


@pytest.fixture(scope="module")
def own_broker():
    with EmbeddedBroker() as b:
        yield b


def start_stage(stack, stage: str, n: int) -> tuple[Proc, int]:
    port = free_port()
    proc = stack.spawn(f"{stage}-{n}", "streams", "--stage", stage,
                       **{f"JITTERSCOPE_{stage.upper()}_WEB_PORT": str(port)})
    return proc, port


class Traffic:
    """Each round, per host: run-queue waits of its serving process behind
    outsiders (a few long enough to alert), then a request span over them
    (every seventh ten times as long: over the SLO its baseline sets);
    the process record every tenth round. Everything sent is kept for the
    reference attribution."""

    def __init__(self, bootstrap: str, hosts: list[str]):
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.hosts, self.random = hosts, random.Random(39)
        self.sent: dict[str, list] = {"processes": [], "runq": [], "spans": []}
        self.seq = 0
        self.rounds_done = 0

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def round(self, number: int) -> None:
        now = time.time_ns()
        for host in self.hosts:
            if number % 10 == 0:
                info = example(events.ProcessInfo, host, self._next(), now) | {
                    "pid": SERVING_PID, "comm": "engine", "cmdline": "engine --serve", "cpus_allowed": [0, 1]}
                self._send(topics.PROCESSES, host, "processes", [info])
            start = now - (3_000_000_000 if number % 7 == 6 else 300_000_000)  # now and then one over its SLO
            waits = []
            for i in range(self.random.randrange(1, 6)):  # each sent as it ends, as a collector does
                wait = self.random.choice((200_000, 2_000_000, 30_000_000, 90_000_000))
                end = now - 300_000_000 + (i + 1) * 50_000_000
                waits.append(example(events.RunqEvent, host, self._next(), end) | {
                    "pid": SERVING_PID, "tid": SERVING_PID + i, "comm": "engine", "cpu": i % 2, "wait_ns": wait,
                    "suspect_pid": 9000 + i, "suspect_tid": 9000 + i, "suspect_comm": f"noisy{i}"})
            self._send(topics.RUNQ, host, "runq", waits)
            span = example(events.RequestSpan, host, self._next(), now) | {
                "name": "generate", "pid": SERVING_PID, "start_ns": start, "end_ns": now,
                "request_id": f"{host}-{number}"}
            self._send(topics.REQUESTS, host, "spans", [span])
        self.producer.flush(30)
        self.rounds_done = number + 1

    def _send(self, topic: str, host: str, kind: str, records: list[dict]) -> None:
        self.producer.produce(topic, lines(*records), key=host.encode())
        self.sent[kind] += records


def reference(traffic: Traffic) -> dict[tuple, events.RequestAttribution]:
    """One attributor fed every record sent: what one process attributes."""
    settings = load()
    worker = types.SimpleNamespace(settings=settings, state=HostState())
    attributor = StreamsWorker._new_attributor(worker)
    decode = lambda kind, records: [msgspec.convert(r, kind) for r in records]  # noqa: E731
    for info in decode(events.ProcessInfo, traffic.sent["processes"]):
        worker.state.learn(info)
    attributor.add_evidence_many(decode(events.RunqEvent, traffic.sent["runq"]))
    for span in decode(events.RequestSpan, traffic.sent["spans"]):
        attributor.add_request(span)
    return {(a.host, a.boot_id, a.seq): a for a in attributor.due(2 ** 62)}


def test_two_processes_per_stage_one_killed_lose_nothing_and_attribute_as_one(own_broker, tmp_path):
    tag = f"scale-{uuid.uuid4().hex[:6]}"
    hosts = host_names(tag, HOSTS)
    stack = make_stack(own_broker, tmp_path)
    stack.env["JITTERSCOPE_ATTRIBUTION_GRACE_S"] = "3"  # evidence well within it, on a busy 2-CPU box too
    try:
        store = stack.spawn("store", "streams", "--stage", "store")
        judges = [start_stage(stack, "judge", n) for n in range(2)]
        attributors = [start_stage(stack, "attribute", n) for n in range(2)]
        wait_until(stack.query_ok, 120, "the store stage answering /query", store)
        for proc, port in judges + attributors:
            wait_until(lambda: metrics(port) is not None, 120, f"{proc.name} answering on {port}", proc)

        traffic = Traffic(own_broker.bootstrap_servers, hosts)
        sending = threading.Thread(target=lambda: [
            (traffic.round(n), time.sleep(ROUND_S)) for n in range(ROUNDS)], daemon=True)
        sending.start()
        wait_until(lambda: traffic.rounds_done > KILL_AT, 120, f"round {KILL_AT} sent")
        killed_at_ns = time.time_ns()
        for proc, _port in (judges[0], attributors[0]):
            os.kill(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait()
        sending.join(240)
        assert not sending.is_alive()

        spans = {(s["host"], s["boot_id"], s["seq"]) for s in traffic.sent["spans"]}
        assert len(spans) == HOSTS * ROUNDS

        def stored() -> int:
            return stack.query("SELECT count() FROM jitterscope.request_attribution FINAL "
                               "WHERE startsWith(host, {t:String})", t=tag)[0][0]

        wait_until(lambda: stored() >= len(spans), 240, f"all {len(spans)} requests attributed and stored",
                   attributors[1][0])
        rows, distinct = stack.query(
            "SELECT count(), uniqExact(host, boot_id, seq) FROM jitterscope.request_attribution FINAL "
            "WHERE startsWith(host, {t:String})", t=tag)[0]
        assert rows == distinct == len(spans)  # nothing lost, one row each

        published = [a for a in records_on_topic(own_broker.bootstrap_servers, topics.ATTRIBUTION,
                                                 events.RequestAttribution) if a.host in hosts]
        twice = {k: n for k, n in Counter((a.host, a.boot_id, a.seq) for a in published).items() if n > 1}
        assert not twice, f"attributed more than once: {twice}"
        assert {(a.host, a.boot_id, a.seq) for a in published} == spans

        expected = reference(traffic)
        assert {a.cause for a in expected.values()} >= {"runq_starvation", "none"}  # the traffic tells causes apart
        assert sum(a.slo_breached for a in expected.values()) > 0  # baselines were learned and judged against
        differ = {key: {f: (getattr(a, f), getattr(expected[key], f)) for f in COMPARED
                        if getattr(a, f) != getattr(expected[key], f)}
                  for a in published if (key := (a.host, a.boot_id, a.seq))}
        differ = {k: d for k, d in differ.items() if d}
        assert not differ, f"{len(differ)} attributed otherwise than by one process, e.g. {list(differ.items())[:3]}"

        # the killed judge's hosts are judged by the other one: late waits of every host alert
        late = dict(stack.query(
            "SELECT host, count() FROM jitterscope.alerts FINAL WHERE startsWith(host, {t:String}) "
            "AND kind = 'runq_starvation' AND ts > fromUnixTimestamp64Nano({s:Int64}) GROUP BY host",
            t=tag, s=killed_at_ns + 15_000_000_000))
        assert set(late) == set(hosts), late
    finally:
        stack.stop_all()
