# SPDX-License-Identifier: Apache-2.0
"""collector/publish.py and collector/spool.py: message size, spool, and the
producer's recovery rules, with a fake producer and a fake clock (no broker)."""

from __future__ import annotations

import logging
import time

import msgspec
import pytest

from jitterscope.collector.publish import KafkaPublisher, RateLimitedLog, StallWatch, is_embedded_broker
from jitterscope.collector.spool import Spool, SpoolBusy
from jitterscope.schemas.batches import split_lines
from jitterscope.schemas.events import RunqEvent
from jitterscope.schemas.batches import BatchDecoder, encode_batch
from jitterscope.schemas.topics import PROCESSES, RUNQ


def runq(seq: int, comm: str = "c") -> RunqEvent:
    return RunqEvent(host="h", boot_id="b", seq=seq, ts_ns=seq, pid=1, tid=1, comm=comm, cpu=0,
                     wait_ns=6_000_000, suspect_pid=2, suspect_tid=2, suspect_comm="s")


# -- message size ----------------------------------------------------------
def test_small_payload_is_one_message():
    payload = encode_batch([runq(i) for i in range(10)])
    assert split_lines(payload, 10_000) == [(payload, 10)]


def test_payload_is_split_below_the_byte_limit_on_record_boundaries():
    records = [runq(i, comm="x" * (i % 50)) for i in range(1000)]
    payload = encode_batch(records)
    limit = 10_000
    chunks = split_lines(payload, limit)
    assert len(chunks) > 1
    assert all(len(chunk) <= limit for chunk, _ in chunks)
    assert sum(n for _, n in chunks) == 1000
    assert b"".join(chunk for chunk, _ in chunks) == payload  # nothing lost or reordered
    decoded = [r for chunk, _ in chunks for r in BatchDecoder(RunqEvent).decode(chunk)[0]]
    assert decoded == records


def test_payload_is_split_by_record_count_too():
    chunks = split_lines(encode_batch([runq(i) for i in range(7)]), 1 << 20, max_records=3)
    assert [n for _, n in chunks] == [3, 3, 1]


def test_a_record_over_the_limit_is_alone_and_refused_by_the_publisher(tmp_path):
    p, fake = make_publisher(tmp_path, max_message_bytes=10_000, spool=False)
    p.send(RUNQ, [runq(1), runq(2, comm="y" * 20_000), runq(3)])
    assert [m.count for m in fake.produced] == [1, 1]
    assert p.given_up == 1 and p.undelivered == 1


# -- spool -----------------------------------------------------------------
def test_spool_replays_in_order_and_deletes_delivered_segments(tmp_path):
    spool = Spool(tmp_path, 1 << 20, segment_bytes=300)
    batches = [encode_batch([runq(i), runq(i + 1)]) for i in range(0, 10, 2)]
    for i, payload in enumerate(batches):
        assert spool.append(RUNQ if i % 2 == 0 else PROCESSES, payload, 2)
    assert spool.records == 10 and spool
    taken = []
    while spool:
        step = spool.take(1 << 20, 500)
        taken += step
        for batch in step:
            spool.settle(batch)
    assert b"".join(b.payload for b in taken) == b"".join(batches)
    assert [b.topic for b in taken] == [RUNQ, PROCESSES, RUNQ, PROCESSES, RUNQ]
    assert spool.records == 0 and not list(tmp_path.glob("*.spool"))


def test_spool_keeps_a_segment_until_every_batch_from_it_is_settled(tmp_path):
    spool = Spool(tmp_path, 1 << 20)
    spool.append(RUNQ, encode_batch([runq(i) for i in range(10)]), 10)
    first, second = spool.take(200, 500)[:2]
    spool.settle(first)
    assert list(tmp_path.glob("*.spool")), "a batch of it is still in flight"
    assert not spool, "but it is not handed out twice"


def test_spool_full_refuses_and_counts_records(tmp_path):
    payload = encode_batch([runq(i) for i in range(20)])
    spool = Spool(tmp_path, len(payload) * 2)
    assert spool.append(RUNQ, payload, 20)
    assert not spool.append(RUNQ, payload + payload, 40)
    assert spool.drops == 40 and spool.records == 20


def test_spool_survives_a_restart_and_skips_a_torn_last_line(tmp_path):
    spool = Spool(tmp_path, 1 << 20)
    spool.append(RUNQ, encode_batch([runq(1), runq(2)]), 2)
    spool.close()
    segment = next(tmp_path.glob("*.spool"))
    with open(segment, "ab") as f:  # a crash in the middle of a write
        f.write(RUNQ.encode() + b' {"v":1,"host":"h","bo')
    again = Spool(tmp_path, 1 << 20)
    assert again.records == 2
    batches = again.take(1 << 20, 500)
    assert [b.count for b in batches] == [2]
    assert again.torn == 1 and again.drops == 1


def test_second_process_on_the_same_spool_is_refused(tmp_path):
    first = Spool(tmp_path, 1 << 20)
    with pytest.raises(SpoolBusy):
        Spool(tmp_path, 1 << 20)
    first.close()
    Spool(tmp_path, 1 << 20).close()


# -- producer rules --------------------------------------------------------
class FakeError:
    def __init__(self, name: str, fatal: bool = False):
        self._name, self._fatal = name, fatal

    def name(self):
        return self._name

    def str(self):
        return self._name.lower()

    def fatal(self):
        return self._fatal


class FakeMessage:
    def __init__(self, topic, payload, on_delivery):
        self.topic, self.payload, self.on_delivery = topic, payload, on_delivery
        self.count = payload.count(b"\n")


class FakeProducer:
    def __init__(self, config):
        self.config = config
        self.produced: list[FakeMessage] = []
        self.purged = False

    def produce(self, topic, payload, key, on_delivery):
        self.produced.append(FakeMessage(topic, payload, on_delivery))

    def poll(self, _timeout=0):
        return 0

    def purge(self, **_kw):
        self.purged = True


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


def make_publisher(tmp_path, spool=True, **kw):
    clock = Clock()
    producers: list[FakeProducer] = []

    class P(KafkaPublisher):
        def _make_producer(self):
            producers.append(FakeProducer(self._config()))
            return producers[-1]

    p = P("b:9092", "h", idempotence=False, spool=Spool(tmp_path / "spool", 1 << 20) if spool else None,
          now=clock, stall_s=30, **kw)
    p.clock, p.producers = clock, producers
    return p, producers[0]


def test_acknowledged_records_are_counted_per_topic(tmp_path):
    p, fake = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1), runq(2)])
    p.send(PROCESSES, [runq(3)])
    for m in fake.produced:
        m.on_delivery(None, None)
    assert p.sent_by_topic == {RUNQ: 2, PROCESSES: 1} and p.records_sent == 3
    fake.produced[0].on_delivery(None, None)  # a duplicate report counts nothing
    assert p.records_sent == 3


def test_each_batch_s_oldest_record_age_is_observed_when_it_is_produced(tmp_path):
    from prometheus_client import REGISTRY

    def observed(stat: str) -> float:
        return REGISTRY.get_sample_value(f"jitterscope_collector_batch_age_seconds_{stat}", {"topic": PROCESSES}) or 0

    p, fake = make_publisher(tmp_path)
    count, total = observed("count"), observed("sum")
    now = time.time_ns()
    p.send(PROCESSES, [msgspec.structs.replace(runq(1), ts_ns=now - 2_000_000_000),
                       msgspec.structs.replace(runq(2), ts_ns=now - 500_000_000)])
    assert observed("count") == count + 1  # one batch, aged by its oldest record
    assert 2.0 <= observed("sum") - total < 10.0


def test_failed_delivery_goes_to_the_spool_and_is_replayed(tmp_path):
    p, fake = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1), runq(2)])
    fake.produced[0].on_delivery(FakeError("_MSG_TIMED_OUT"), None)
    assert p.delivery_errors == 1 and p.spooled == 2
    p.send(RUNQ, [runq(3)])  # queues behind the spooled batch, on disk
    assert len(fake.produced) == 1 and p.spooled == 3
    p.poll()  # broker back: replay
    assert [m.count for m in fake.produced[1:]] == [3]
    fake.produced[1].on_delivery(None, None)
    assert p.sent_by_topic == {RUNQ: 3} and p.spooled == 0
    assert not list((tmp_path / "spool").glob("*.spool"))


def test_permanent_errors_are_given_up_not_retried(tmp_path):
    p, fake = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1)])
    fake.produced[0].on_delivery(FakeError("TOPIC_AUTHORIZATION_FAILED"), None)
    assert p.given_up == 1 and p.spooled == 0 and p.undelivered == 1


def test_fatal_error_recreates_the_producer_and_resends_the_unacknowledged(tmp_path):
    p, first = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1)])
    p.send(RUNQ, [runq(2)])
    first.produced[0].on_delivery(None, None)
    first.config["error_cb"](FakeError("_FATAL", fatal=True))
    p.poll()
    second = p.producers[-1]
    assert second is not first and first.purged and p.producer_restarts == 1
    assert [m.payload for m in second.produced] == [first.produced[1].payload]
    first.produced[1].on_delivery(FakeError("_PURGE_INFLIGHT"), None)  # the old one's late report
    second.produced[0].on_delivery(None, None)
    assert p.records_sent == 2 and p.delivery_errors == 0


def test_a_stalled_producer_is_recreated_with_backoff(tmp_path):
    p, first = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1)])
    p.poll()
    p.clock.t += 29
    p.poll()
    assert p.producer_restarts == 0
    p.clock.t += 1
    p.poll()
    assert p.producer_restarts == 1 and len(p.producers) == 2
    p.clock.t += 59  # no progress since: the next restart waits twice as long
    p.poll()
    assert p.producer_restarts == 1
    p.clock.t += 1
    p.poll()
    assert p.producer_restarts == 2
    p.producers[-1].produced[0].on_delivery(None, None)
    assert p.records_sent == 1
    p.clock.t += 1000
    p.poll()  # nothing waiting: no stall
    assert p.producer_restarts == 2


def test_stall_watch_resets_on_progress():
    w = StallWatch(10, max_s=40)
    assert not w.stalled(0, True)
    w.progress(9)
    assert not w.stalled(18, True) and w.stalled(19, True)
    w.restarted(19)
    w.restarted(19)
    w.restarted(19)
    assert w.wait_s == 40
    w.progress(20)
    assert w.wait_s == 10


def test_over_the_memory_budget_batches_wait_on_disk(tmp_path):
    p, fake = make_publisher(tmp_path, max_inflight_bytes=1000)
    for i in range(20):
        p.send(RUNQ, [runq(i)])
    assert 0 < len(fake.produced) < 20 and p.spooled == 20 - len(fake.produced)
    p.poll()  # budget still full: replay waits, and does not spin
    for m in list(fake.produced):
        m.on_delivery(None, None)
    for _ in range(50):
        p.poll()
        for m in fake.produced:
            if m.on_delivery:
                m.on_delivery(None, None)
    assert p.records_sent == 20 and p.spooled == 0


def test_without_a_spool_drops_are_counted(tmp_path):
    p, fake = make_publisher(tmp_path, spool=False, max_inflight_bytes=1000)
    for i in range(20):
        p.send(RUNQ, [runq(i)])
    assert p.spool_drops == 20 - len(fake.produced) > 0
    assert p.undelivered == p.spool_drops


def test_flush_leaves_what_is_unacknowledged_in_the_spool(tmp_path):
    p, fake = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1), runq(2)])
    p.clock.t += 0  # the fake never delivers; flush gives up at its deadline
    real_now = p.clock

    def ticking():
        real_now.t += 0.5
        return real_now.t
    p._now = ticking
    assert p.flush(2.0) == 1
    assert p.spooled == 2 and p.undelivered == 0


def test_embedded_broker_is_recognised():
    assert is_embedded_broker("tansu_cluster")
    assert not is_embedded_broker("MkU3OEVBNTcwNTJENDM2Qg") and not is_embedded_broker(None)


def test_auto_idempotence_follows_the_broker(tmp_path):
    p, fake = make_publisher(tmp_path)
    p._idempotence = None

    class Metadata:
        cluster_id = "tansu_cluster"
    fake.list_topics = lambda timeout: Metadata
    p.check_reachable()
    assert p._idempotence is False
    Metadata.cluster_id = "real-kafka"
    p._idempotence = None
    p.check_reachable()
    assert p._idempotence is True and p.producers[-1].config["enable.idempotence"] is True


def test_rate_limited_log_says_once_then_how_many_were_held(caplog):
    clock = Clock()
    say = RateLimitedLog(logging.getLogger("t"), 60, now=clock)
    with caplog.at_level(logging.INFO):
        assert say(logging.WARNING, "k", "broker down")
        for _ in range(100):
            assert not say(logging.WARNING, "k", "broker down")
        clock.t += 60
        assert say(logging.WARNING, "k", "broker down")
    assert len(caplog.records) == 2 and caplog.records[1].fields["similar_since_last"] == 100


def test_produce_on_a_dead_producer_keeps_the_batch_for_the_next_one(tmp_path):
    from confluent_kafka import KafkaError, KafkaException

    p, first = make_publisher(tmp_path)

    def dead(*_a, **_kw):
        raise KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    first.produce = dead
    p.send(RUNQ, [runq(1)])  # must not raise into the collector's loop
    p.poll()
    assert p.producer_restarts == 1 and [m.count for m in p.producers[-1].produced] == [1]


def test_a_fatal_error_raised_by_poll_replaces_the_producer(tmp_path):
    """librdkafka can raise a fatal error from poll() itself (seen in CI:
    UNKNOWN_PRODUCER_ID after a broker restart); it must not end the loop."""
    from confluent_kafka import KafkaError, KafkaException

    p, first = make_publisher(tmp_path)
    p.send(RUNQ, [runq(1)])

    def fatal_poll(_timeout=0):
        raise KafkaException(KafkaError(KafkaError._FATAL, "unknown producer id", fatal=True))
    first.poll = fatal_poll
    p.poll()  # must not raise into the collector's loop
    second = p.producers[-1]
    assert second is not first and p.producer_restarts == 1
    assert [m.count for m in second.produced] == [1]
