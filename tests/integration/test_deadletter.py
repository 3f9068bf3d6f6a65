# SPDX-License-Identifier: Apache-2.0
"""Bad input goes to the dead-letter topic with its reason; good input around
it still lands in ClickHouse; redelivered records are stored once."""

from __future__ import annotations

import time
import uuid

import msgspec
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from jitterscope.schemas import batches, events, topics
from tests.conftest import json_lines, wait_until

pytestmark = pytest.mark.integration


def runq(host: str, seq: int) -> events.RunqEvent:
    return events.RunqEvent(host=host, boot_id="boot-1", seq=seq, ts_ns=time.time_ns(), pid=100, tid=101,
                            comm="vllm", cpu=3, wait_ns=2_000_000, suspect_pid=200, suspect_tid=200,
                            suspect_comm="logrotate")


def produce(broker, host: str, *payloads: bytes) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for payload in payloads:
        producer.produce(topics.RUNQ, payload, key=host.encode())
    assert producer.flush(10) == 0


def dead_letters(broker, host: str) -> list[dict]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topics.DEADLETTER, p, 0) for p in range(topics.PARTITIONS)])
    found, deadline = [], time.monotonic() + 3
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            found.extend(d for d in json_lines(message.value()) if host in d["payload"] or d["line"] == 1)
    consumer.close()
    return found


@pytest.fixture(scope="module")
def worker(stack):
    return stack.start_worker()


def test_garbage_goes_to_deadletter_and_valid_records_still_arrive(stack, worker):
    host = f"dlq-{uuid.uuid4().hex[:8]}"
    good = [runq(host, seq) for seq in range(5)]
    v2 = msgspec.json.encode(runq(host, 99)).replace(b'"v":1', b'"v":2')
    missing = msgspec.json.encode({"v": 1, "host": host, "boot_id": "b", "seq": 98, "ts_ns": 1})
    produce(stack.broker, host,
            b"\xff\xfe this is not json at all",
            batches.encode_batch(good[:2]) + v2 + b"\n" + missing + b"\n" + batches.encode_batch(good[2:3]),
            batches.encode_batch(good[3:]))

    stored = wait_until(
        lambda: (rows := stack.query("SELECT seq FROM jitterscope.runq_events WHERE host = {h:String} ORDER BY seq",
                                     h=host)) and len(rows) == 5 and rows,
        60, "the five valid records in ClickHouse", worker)
    assert [r[0] for r in stored] == [0, 1, 2, 3, 4]

    letters = wait_until(
        lambda: (rows := stack.query(
            "SELECT line, reason, payload FROM jitterscope.deadletter WHERE payload LIKE {p:String} "
            "OR payload LIKE '%not json%' ORDER BY offset, line", p=f"%{host}%")) and len(rows) == 3 and rows,
        30, "three dead letters in ClickHouse", worker)
    garbage, version, incomplete = letters
    assert garbage[0] == 1 and "malformed" in garbage[1] and "not json" in garbage[2]
    assert version[0] == 3 and "unknown schema version" in version[1]
    assert incomplete[0] == 4 and "pid" in incomplete[1]

    topic_letters = dead_letters(stack.broker, host)
    reasons = " | ".join(d["reason"] for d in topic_letters)
    assert "unknown schema version" in reasons and "malformed" in reasons
    assert all(d["topic"] == topics.RUNQ and d["offset"] >= 0 for d in topic_letters)
    assert worker.popen.poll() is None, "the worker must keep running after bad input"


def test_redelivered_records_are_stored_once(stack, worker):
    host = f"dup-{uuid.uuid4().hex[:8]}"
    batch = batches.encode_batch([runq(host, seq) for seq in range(10)])
    sentinel = batches.encode_batch([runq(host, 1000)])
    # at-least-once delivery: the same batch twice; the sentinel (same key, so
    # same partition, so after both) shows when both have been stored
    produce(stack.broker, host, batch, batch, sentinel)
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.runq_events WHERE host = {h:String} "
                                   "AND seq = 1000", h=host) == [[1]], 60, "the sentinel stored", worker)
    assert stack.query("SELECT count(), uniqExact(seq) FROM jitterscope.runq_events FINAL "
                       "WHERE host = {h:String}", h=host) == [[11, 11]]
