# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py store-path` and `store-kafka`: the storing stage's cost per
record, the vLLM mix (bench/vllm_mix.py) through the sink into embedded chDB.

store-path: in one process, each message decoded (schemas/batches.py: the
judge of a record, and the keys the sink's dedup needs), each topic's
records written in chunks of sink_batch_rows (as streams/store_path.py
does); this tree's sink and decoder (decoded) and the sink and decoder as
they were before issue 39 (BEFORE) take turns round by round over the same
messages, each round under a fresh boot_id (no redelivery to look up).
Wall time and the process's CPU time (chDB's threads included) per round.

store-kafka: the same, fed by an aiokafka consumer (Faust's driver) from the
embedded broker, committing after each chunk: a store process's rate with
its Kafka reads.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from jitterscope.schemas import batches, topics
from jitterscope.streams import clickhouse, sink

TARGET = 200_000
#: the sink and the decoder before the per-run key bookkeeping and the decoder's one replace (issue 39)
BEFORE = "d485576"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def vllm_messages(records: int) -> tuple[list[tuple[str, bytes]], int]:
    """(topic, NDJSON payload) of enough vLLM-shaped hosts' mix for about ``records``; (messages, hosts)."""
    import mix

    hosts = 8
    seconds = max(mix.TICK_S, records / (hosts * mix.vllm_host_rate()))
    return [(topic, payload) for _at, topic, _key, payload, _n in
            mix.schedule(hosts, seconds, time.time_ns(), shape="vllm")], hosts


def _reboot(messages: list[tuple[str, bytes]], boot: str) -> list[tuple[str, bytes]]:
    return [(topic, payload.replace(b'"boot_id":"vllm"', f'"boot_id":"{boot}"'.encode()))
            for topic, payload in messages]


class Arm(NamedTuple):
    """One way to store: a sink, the decoders."""

    writer: object
    decoders: dict


async def store_messages(arm: Arm, messages: list[tuple[str, bytes]], step: int) -> int:
    """What a store process does with a take of messages: decode each, write
    each topic's in chunks of ``step``; records stored."""
    stored = 0
    by_topic: dict[str, list] = {}
    for topic, payload in messages:
        good, _bad = arm.decoders[topic].decode(payload)
        by_topic.setdefault(topic, []).extend(good)
    for topic, records in by_topic.items():
        table = clickhouse.TABLE_OF[topics.INPUT_TOPICS[topic]]
        for start in range(0, len(records), step):
            chunk = records[start:start + step]
            await arm.writer.write(table, chunk)
            stored += len(chunk)
    return stored


DECODERS = {topic: batches.BatchDecoder(kind) for topic, kind in topics.INPUT_TOPICS.items()}


def arms(client) -> dict[str, Arm]:
    """before (BEFORE's sink and decoder), decoded (this tree's)."""
    from common import _modules_at
    from prometheus_client import REGISTRY

    ours = (sink.ROWS_WRITTEN, sink.INSERT_FAILURES)  # the old sink registers the same metric names
    for metric in ours:
        REGISTRY.unregister(metric)
    old = _modules_at(BEFORE, ["schemas/batches.py", "streams/sink.py"])
    for theirs, metric in zip((old["streams/sink.py"].ROWS_WRITTEN, old["streams/sink.py"].INSERT_FAILURES), ours):
        REGISTRY.unregister(theirs)
        REGISTRY.register(metric)
    old_decoders = {topic: old["schemas/batches.py"].BatchDecoder(kind) for topic, kind in topics.INPUT_TOPICS.items()}
    return {"before": Arm(old["streams/sink.py"].ClickHouseSink(client), old_decoders),
            "decoded": Arm(sink.ClickHouseSink(client), DECODERS)}


def _turns(labels: list[str], r: int) -> list[str]:
    return labels[r % len(labels):] + labels[:r % len(labels)]


def _rows(what: str, took: dict[str, list[tuple[float, float]]]) -> str:
    """This tree's row against ``before``: (records/s wall, records per CPU-second) per round."""
    med = {label: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
           for label, runs in took.items()}
    spread = {label: (_spread([w for w, _ in runs]), _spread([c for _, c in runs])) for label, runs in took.items()}
    label = "decoded"
    return (
        f"| {what}: **{label}** | {spread[label][0]} records/s wall, {spread[label][1]} per CPU-second | "
        f"before ({BEFORE}): {spread['before'][0]} wall, {spread['before'][1]} per CPU-s | "
        f"{med[label][0] / med['before'][0]:.2f}x wall, {med[label][1] / med['before'][1]:.2f}x CPU; "
        f"the goal {TARGET:,}: {med[label][0] / TARGET:.2f}x wall |")


def _round(arm: Arm, messages, step: int) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), _cpu_s()
    n = asyncio.run(store_messages(arm, messages, step))
    return time.perf_counter() - wall, _cpu_s() - cpu, n


def bench_store_path(records: int = 200_000, rounds: int = 4, step: int = 50_000) -> str:
    """Each arm in turn over the same messages, in one process."""
    messages, hosts = vllm_messages(records)
    took: dict[str, list[tuple[float, float]]] = {"before": [], "decoded": []}
    with tempfile.TemporaryDirectory() as tmp:
        client = clickhouse.connect(None, Path(tmp))
        clickhouse.migrate(client)
        ways = arms(client)
        for label, arm in ways.items():  # takeover (rebuild queries) of each host, once per sink
            _round(arm, _reboot(messages, f"warm-{label}"), step)
        for r in range(rounds):
            for label in _turns(list(ways), r):
                wall, cpu, n = _round(ways[label], _reboot(messages, f"{label}-{r}"), step)
                took[label].append((n / wall, n / cpu))
        decode = {label: min(_timed_decode(ways[label].decoders, messages) for _ in range(3))
                  for label in ("before", "decoded")}
        client.close()
    return "\n".join([
        _rows(f"store path, vLLM mix ({hosts} hosts, {n:,} records in {len(messages):,} messages, 4 topics): "
              f"decode → sink.write in chunks of {step:,} → chDB, one process, {rounds} rounds each in turn", took),
        f"| of which decoding alone (BatchDecoder, the same messages) | {n / decode['decoded']:,.0f} records/s | "
        f"before ({BEFORE}): {n / decode['before']:,.0f} | {decode['before'] / decode['decoded']:.2f}x |"])


def _timed_decode(decoders: dict, messages) -> float:
    started = time.perf_counter()
    for topic, payload in messages:
        decoders[topic].decode(payload)
    return time.perf_counter() - started


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def _produce(bootstrap: str, messages: list[tuple[str, bytes]], suffix: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5,
                         "message.max.bytes": 8_000_000})
    for topic, payload in messages:
        key = payload[payload.index(b'"host":"') + 8:].split(b'"', 1)[0]
        producer.produce(topic + suffix, payload, key=key)
        producer.poll(0)
    assert producer.flush(60) == 0


async def consume_and_store(bootstrap: str, arm: Arm, names: list[str], suffix: str, records: int,
                            step: int) -> int:
    """A store process: fetch the topics ``names`` + ``suffix`` (this round's
    copies: Tansu's high-water marks under-report, so a round cannot start at
    the last one's end) from their start, decode, write each take in chunks,
    commit; until ``records`` are stored."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"bench-{time.time_ns()}",
                                enable_auto_commit=False, fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20,
                                fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        assigned = [TopicPartition(t + suffix, p) for t in names for p in range(topics.PARTITIONS)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        stored = 0
        while stored < records:
            take = await consumer.getmany(timeout_ms=200, max_records=2_000)
            messages = [(tp.topic.removesuffix(suffix), m.value) for tp, batch in take.items() for m in batch]
            stored += await store_messages(arm, messages, step)
            await consumer.commit()
        return stored
    finally:
        await consumer.stop()


def bench_store_kafka(records: int = 200_000, rounds: int = 2, step: int = 50_000) -> str:
    """store-path's arms, each fed from the embedded broker by one aiokafka consumer."""
    from jitterscope.broker import EmbeddedBroker, create_topics

    messages, hosts = vllm_messages(records)
    n = sum(len(DECODERS[t].decode(p)[0]) for t, p in messages)
    took: dict[str, list[tuple[float, float]]] = {"before": [], "decoded": []}
    broker = EmbeddedBroker().start()
    try:
        names = sorted({t for t, _ in messages})
        with tempfile.TemporaryDirectory() as tmp:
            client = clickhouse.connect(None, Path(tmp))
            clickhouse.migrate(client)
            ways = arms(client)
            for r in range(rounds + 1):  # the first round of each warms up (takeovers), unrecorded
                for label in _turns(list(ways), r):
                    suffix = f".{label}{r}"
                    create_topics(broker.bootstrap_servers, names=[t + suffix for t in names])
                    _produce(broker.bootstrap_servers, _reboot(messages, f"{label}-{r}"), suffix)
                    wall, cpu = time.perf_counter(), _cpu_s()
                    stored = asyncio.run(consume_and_store(broker.bootstrap_servers, ways[label], names, suffix,
                                                           n, step))
                    assert stored == n, (stored, n)
                    if r:
                        took[label].append((n / (time.perf_counter() - wall), n / (_cpu_s() - cpu)))
            client.close()
    finally:
        broker.stop()
    return _rows(f"a store process fed by Kafka, the same vLLM mix ({hosts} hosts, {n:,} records, lz4) in the "
                 f"embedded broker → one aiokafka consumer (getmany, commit per take) → decode → sink.write → chDB, "
                 f"{rounds} rounds each in turn", took)


if __name__ == "__main__":
    import os
    import platform
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    benches = {"store-path": bench_store_path, "store-kafka": bench_store_kafka}
    names = sys.argv[1:] or list(benches)
    print(f"\n### {time.strftime('%Y-%m-%d %H:%M')} — {platform.node()}, {os.cpu_count()} CPUs\n")
    print(f"`.venv/bin/python bench/store.py {' '.join(names)}`\n")
    print("| what | measured | baseline (same run) | ratio |\n|---|---|---|---|")
    for name in names:
        print(benches[name](), flush=True)
