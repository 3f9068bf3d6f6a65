# SPDX-License-Identifier: Apache-2.0
"""The streams worker under poison and faults, with a real broker and chDB:
out-of-range records on every input topic are dead-lettered one by one while
the records around them (and after them) are stored; a backlog of 10,000
request spans is attributed without a crash; redelivered batches and
`kill -9` of the worker leave every table and every rollup exact."""

from __future__ import annotations

import os
import signal
import time
import uuid

import msgspec
import pytest
from confluent_kafka import Producer

from jitterscope.schemas import events, topics
from jitterscope.streams.clickhouse import TABLE_OF
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

_FILLER = {msgspec.inspect.IntType: 1, msgspec.inspect.StrType: "x", msgspec.inspect.ListType: [],
           msgspec.inspect.DictType: {}, msgspec.inspect.FloatType: 0.5, msgspec.inspect.BoolType: False}


def example(record_type: type[events.Record], host: str, seq: int, ts_ns: int | None = None) -> dict:
    """A valid record of any type, as a dict: every required field filled."""
    ts_ns = ts_ns or time.time_ns()
    fields = {f.name: _FILLER[type(f.type)] for f in msgspec.inspect.type_info(record_type).fields if f.required}
    fields.update(host=host, boot_id="boot-f", seq=seq, ts_ns=ts_ns)
    for name in ("start_ns", "end_ns", "started_ns"):
        if name in fields:
            fields[name] = ts_ns
    if "stack_id" in fields:
        fields["stack_id"] = seq  # the stacks table keeps one row per stack id: a distinct stack each
    return fields


def send(broker, topic: str, host: str, *payloads: bytes) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for payload in payloads:
        producer.produce(topic, payload, key=host.encode())
    assert producer.flush(30) == 0


def lines(*records: dict) -> bytes:
    return b"".join(msgspec.json.encode(r) + b"\n" for r in records)


@pytest.fixture(scope="module")
def worker(stack):
    return stack.start_worker_with(JITTERSCOPE_ATTRIBUTION_GRACE_S="0.5")


def count(stack, table: str, host: str) -> int:
    return stack.query(f"SELECT count() FROM jitterscope.{table} FINAL WHERE host = {{h:String}}", h=host)[0][0]


@pytest.mark.parametrize("topic", sorted(topics.INPUT_TOPICS))
def test_out_of_range_records_are_dead_lettered_and_the_topic_keeps_flowing(stack, worker, topic):
    record_type = topics.INPUT_TOPICS[topic]
    table = TABLE_OF[record_type]
    host = f"poison-{uuid.uuid4().hex[:8]}"
    poison = [example(record_type, host, 10) | {"seq": -1}, example(record_type, host, 11) | {"seq": 2**64 + 3},
              example(record_type, host, 12) | {"ts_ns": 2**63}]
    send(stack.broker, topic, host,
         lines(example(record_type, host, 1), *poison, example(record_type, host, 2)),
         b"\x00\xffnot json\n" + lines(example(record_type, host, 3)),
         *(lines(example(record_type, host, seq)) for seq in range(4, 14)))
    wait_until(lambda: count(stack, table, host) == 13, 90, f"13 valid {table} records stored", worker)
    letters = wait_until(
        lambda: (rows := stack.query(
            "SELECT line, reason, partition, offset FROM jitterscope.deadletter WHERE host = {h:String} "
            "ORDER BY offset, line", h=host)) and len(rows) == 4 and rows, 60, "four dead letters", worker)
    assert [line for line, *_ in letters] == [2, 3, 4, 1]
    assert "seq" in letters[0][1] and "seq" in letters[1][1] and "ts_ns" in letters[2][1]
    first_offset = letters[0][3]
    assert letters[3][3] == first_offset + 1, "each dead letter carries its message's real offset"
    assert worker.popen.poll() is None


def test_a_backlog_of_10000_requests_is_attributed_without_a_crash(stack, worker):
    host = f"backlog-{uuid.uuid4().hex[:8]}"
    end = time.time_ns() - 5_000_000_000
    spans = [example(events.RequestSpan, host, seq, end) | {
        "request_id": f"req-{seq}-" + "r" * 200, "start_ns": end - 10_000_000, "name": "llm_request"}
        for seq in range(10_000)]
    send(stack.broker, topics.REQUESTS, host, *(lines(*spans[i:i + 500]) for i in range(0, len(spans), 500)))
    wait_until(lambda: count(stack, "request_attribution", host) == 10_000, 180, "10,000 attributions", worker)
    assert worker.popen.poll() is None
    rollup = stack.query("SELECT sum(requests) FROM jitterscope.attribution_minute WHERE host = {h:String}", h=host)
    assert rollup == [[10_000]]


def histogram(host: str, seq: int, ts_ns: int) -> dict:
    return example(events.LatencyHistogram, host, seq, ts_ns) | {
        "probe": "runq", "pid": 7, "comm": "vllm", "slots": [3, 4], "counts": [10, 5]}


def test_redelivered_batches_do_not_change_the_rollups(stack, worker):
    host = f"rollup-{uuid.uuid4().hex[:8]}"
    now = time.time_ns()
    histograms = lines(*(histogram(host, seq, now) for seq in range(20)))
    spans = lines(*(example(events.RequestSpan, host, seq, now - 3_000_000_000) | {"name": "llm_request"}
                    for seq in range(50)))
    runq = lines(*(example(events.RunqEvent, host, seq, now) | {"wait_ns": 7_000_000} for seq in range(30)))
    for _ in range(3):  # the same batches delivered three times
        send(stack.broker, topics.HISTOGRAMS, host, histograms)
        send(stack.broker, topics.REQUESTS, host, spans)
        send(stack.broker, topics.RUNQ, host, runq)
    sentinel = lines(histogram(host, 1000, now))
    send(stack.broker, topics.HISTOGRAMS, host, sentinel)
    wait_until(lambda: count(stack, "latency_histograms", host) == 21, 90, "histograms stored", worker)
    wait_until(lambda: count(stack, "request_attribution", host) == 50, 90, "spans attributed", worker)
    observations = stack.query("SELECT sum(observations) FROM jitterscope.latency_minute WHERE host = {h:String}",
                               h=host)
    assert observations == [[21 * 15]]
    requests = stack.query("SELECT sum(requests) FROM jitterscope.attribution_minute WHERE host = {h:String}", h=host)
    assert requests == [[50]]
    wait_until(lambda: count(stack, "runq_events", host) == 30, 90, "run-queue events stored", worker)
    waits = stack.query("SELECT sum(waits), sum(waited_ns) FROM jitterscope.runq_minute WHERE host = {h:String}",
                        h=host)
    assert waits == [[30, 30 * 7_000_000]]


def test_kill_9_of_the_worker_five_times_under_load_loses_nothing_and_counts_once(stack, worker):
    host = f"kill9-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": stack.broker.bootstrap_servers, "linger.ms": 5})
    sent = {"runq": 0, "spans": 0, "histograms": 0}
    seq = 0

    def send_some(messages: int) -> None:
        nonlocal seq
        now = time.time_ns()
        for _ in range(messages):
            runq = [example(events.RunqEvent, host, seq + i, now) for i in range(100)]
            producer.produce(topics.RUNQ, lines(*runq), key=host.encode())
            span = example(events.RequestSpan, host, seq, now - 2_000_000_000) | {"name": "llm_request"}
            producer.produce(topics.REQUESTS, lines(span), key=host.encode())
            producer.produce(topics.HISTOGRAMS, lines(histogram(host, seq, now)), key=host.encode())
            sent["runq"] += 100
            sent["spans"] += 1
            sent["histograms"] += 1
            seq += 100
        producer.poll(0)

    current = worker
    recoveries = []
    for kill in range(5):
        send_some(20)
        stored_before = count(stack, "runq_events", host) if kill else 0
        wait_until(lambda: count(stack, "runq_events", host) > stored_before, 120,
                   f"progress before kill {kill + 1}", current)
        send_some(20)  # in flight while it dies
        os.kill(current.popen.pid, signal.SIGKILL)
        current.popen.wait()
        killed_at = time.monotonic()
        current = stack.start_worker_with(JITTERSCOPE_ATTRIBUTION_GRACE_S="0.5")
        recoveries.append(time.monotonic() - killed_at)
    send_some(5)
    assert producer.flush(30) == 0
    wait_until(lambda: count(stack, "runq_events", host) == sent["runq"], 180, "every run-queue event", current)
    wait_until(lambda: count(stack, "request_attribution", host) == sent["spans"], 120, "every span attributed",
               current)
    wait_until(lambda: count(stack, "latency_histograms", host) == sent["histograms"], 60, "every histogram", current)
    assert stack.query("SELECT sum(requests) FROM jitterscope.attribution_minute WHERE host = {h:String}",
                       h=host) == [[sent["spans"]]]
    assert stack.query("SELECT sum(observations) FROM jitterscope.latency_minute WHERE host = {h:String}",
                       h=host) == [[sent["histograms"] * 15]]
    assert stack.query("SELECT sum(waits) FROM jitterscope.runq_minute WHERE host = {h:String}",
                       h=host) == [[sent["runq"]]]
    # the ledger's seq bitmaps hold every stored run-queue seq (a takeover feeds its window again)
    assert stack.query("SELECT groupBitmapMerge(seqs) FROM jitterscope.seq_blocks WHERE host = {h:String} "
                       "AND tbl = 'runq_events'", h=host) == [[sent["runq"]]]
    print(f"\n[measured] worker kill -9 x5: {sent} sent, all stored once; worker answering again "
          f"{min(recoveries):.1f}-{max(recoveries):.1f} s after each kill")
