# SPDX-License-Identifier: Apache-2.0
"""Poison-proofing: the shared records refuse what does not fit their
ClickHouse columns, messages are split below the broker's limit, the sink
skips stored keys for rollup sources, and losses raise an alert."""

from __future__ import annotations

import msgspec
import pytest

from jitterscope.schemas import batches, events, topics
from jitterscope.streams.rules.losses import LossWatch, event_loss
from jitterscope.streams.sink import unseen


def runq(**changes) -> dict:
    good = dict(v=1, host="h", boot_id="b", seq=1, ts_ns=1_800_000_000_000_000_000, pid=1, tid=1, comm="x", cpu=0,
                wait_ns=1, suspect_pid=0, suspect_tid=0, suspect_comm="")
    return {**good, **changes}


@pytest.mark.parametrize("field,value", [
    ("seq", -1), ("seq", 2**64 + 1), ("ts_ns", 2**63), ("ts_ns", -5), ("pid", 2**32), ("cpu", 70_000),
    ("wait_ns", -1),
])
def test_values_that_do_not_fit_their_column_are_bad_lines(field, value):
    decoder = batches.BatchDecoder(events.RunqEvent)
    payload = b"\n".join(msgspec.json.encode(r) for r in (runq(seq=1), runq(**{field: value}), runq(seq=3)))
    good, bad = decoder.decode(payload)
    assert [r.seq for r in good] == [1, 3]
    assert [b.line for b in bad] == [2] and field in bad[0].reason


def test_every_input_record_type_bounds_its_times():
    for record_type in topics.INPUT_TOPICS.values():
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({"host": "h", "boot_id": "b", "seq": 1, "ts_ns": 2**63}, record_type)


def test_messages_are_split_below_the_byte_limit():
    records = [events.RunqEvent(**{k: v for k, v in runq(seq=i, comm="c" * 100).items() if k != "v"})
               for i in range(1000)]
    messages = [m for m, _ in batches.split_lines(batches.encode_batch(records), 10_000)]
    assert len(messages) > 10 and all(len(m) <= 10_000 for m in messages)
    decoded = [r for m in messages for r in batches.BatchDecoder(events.RunqEvent).decode(m)[0]]
    assert decoded == records
    assert [m for m, _ in batches.split_lines(batches.encode_batch(records[:1]), 10)] == \
        [batches.encode_batch(records[:1])]  # one record always goes


def test_unseen_drops_stored_keys_and_repeats_within_the_batch():
    records = [events.RunqEvent(**{k: v for k, v in runq(seq=s).items() if k != "v"}) for s in (1, 2, 2, 3)]
    assert [r.seq for r in unseen(records, {("h", "b", 1)})] == [2, 3]


def stats(ts_s: int, ringbuf: int = 0, spool: int = 0, started: int = 1) -> events.CollectorStats:
    return events.CollectorStats(host="h", boot_id="b", seq=ts_s, ts_ns=ts_s * 10**9, started_ns=started,
                                 ringbuf_drops=ringbuf, events_read=0, records_sent=0, delivery_errors=0,
                                 spool_drops=spool)


def test_loss_alert_counts_drops_since_the_previous_record_of_the_same_run():
    assert event_loss(stats(10, ringbuf=5000), stats(20, ringbuf=5500), 1000, 0) is None
    alert = event_loss(stats(10, ringbuf=5000), stats(20, ringbuf=7000, spool=10), 1000, 0)
    assert alert.kind == "event_loss" and "2010" in alert.summary and "spool_max_mb" in alert.remedy
    # a new collector run starts its counters at zero
    assert event_loss(stats(10, ringbuf=5000), stats(20, ringbuf=1500, started=2), 1000, 0) is not None


def test_loss_watch_ignores_redelivered_older_records():
    watch = LossWatch(100)
    assert watch.judge(stats(10, ringbuf=500)) is not None
    assert watch.judge(stats(5, ringbuf=200)) is None
    assert watch.judge(stats(20, ringbuf=550)) is None


class RefusingSink:
    """Stands in for ClickHouse: refuses any insert holding a record with a
    refused seq, like a server refusing a whole block for one bad row."""

    def __init__(self, refused: set[int]):
        self.refused = refused
        self.stored: list[int] = []
        self.inserts = 0

    async def write(self, table, records):
        self.inserts += 1
        if any(r.seq in self.refused for r in records):
            raise ValueError("Cannot parse input")
        self.stored.extend(r.seq for r in records)


def test_a_refused_batch_is_bisected_down_to_its_bad_records():
    import asyncio

    from jitterscope.streams.app import Decoded, StreamsWorker

    worker = StreamsWorker.__new__(StreamsWorker)  # the isolation logic needs only a sink
    worker.sink = RefusingSink({17, 600})
    messages = [Decoded([events.RunqEvent(**{k: v for k, v in runq(seq=m * 100 + i).items() if k != "v"})
                         for i in range(100)], [], [], partition=2, offset=40 + m, host="h") for m in range(10)]
    rows = [(d, r) for d in messages for r in d.records]
    dead = asyncio.run(worker._store_isolating("jitterscope.runq", "runq_events", rows))
    assert sorted(worker.sink.stored) == [s for s in range(1000) if s not in (17, 600)]
    assert [(d.offset, d.partition, d.host, '"seq":17' in d.payload or '"seq":600' in d.payload) for d in dead] == \
        [(40, 2, "h", True), (46, 2, "h", True)]
    assert worker.sink.inserts < 60  # O(bad x log n), not one insert per record
