# SPDX-License-Identifier: Apache-2.0
"""Run-queue events at microsecond resolution in storage (migration 015) on
real chDB: a store from before it keeps every event with its ns digits, new
events are stored in whole microseconds in the same ns columns, a redelivered
batch is still stored once, and a dense day's events take at most 10 B each."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from jitterscope.reports import synthetic
from jitterscope.schemas.events import RunqEvent
from jitterscope.streams import clickhouse, sink
from tests.conftest import as_sent_before

pytestmark = pytest.mark.integration

T0 = 1_780_000_000_123_456_789  # sub-microsecond digits on purpose


def runq(seq: int, host: str = "h1") -> RunqEvent:
    return RunqEvent(host=host, boot_id="b1", seq=seq, ts_ns=T0 + seq * 1_000_003, pid=10, tid=11, comm="vllm",
                     cpu=seq % 4, wait_ns=12_345_678 + seq, suspect_pid=20, suspect_tid=21, suspect_comm="hog")


def stored(client, host: str) -> list[RunqEvent]:
    return sorted(clickhouse.select_records(client, RunqEvent, "host = {h:String}", {"h": host}),
                  key=lambda r: r.seq)


def test_an_upgraded_store_keeps_every_event_and_stores_new_ones_in_whole_microseconds(tmp_path, monkeypatch):
    client = clickhouse.connect(None, tmp_path)
    every = clickhouse.migrations()
    monkeypatch.setattr(clickhouse, "migrations", lambda: [m for m in every if m[0] < 15])
    with monkeypatch.context() as before:  # the code before 015 stored what it was sent
        before.setattr(clickhouse, "MICROSECOND_FIELDS", {})
        clickhouse.migrate(client)
        old = [runq(s, "old") for s in range(50)]
        clickhouse.insert_records(client, "runq_events", as_sent_before(old, "waits", "suspect_own"))  # 017, 018 added
    monkeypatch.setattr(clickhouse, "migrations", lambda: every)
    assert 15 in clickhouse.migrate(client)

    assert stored(client, "old") == old, "rows stored before 015 keep every field, ns digits included"
    codecs = dict(client.query("SELECT name, compression_codec FROM system.columns WHERE database = 'jitterscope' "
                               "AND table = 'runq_events' AND name IN ('ts', 'wait_ns')").result_rows)
    assert "GCD" in codecs["ts"] and "GCD" in codecs["wait_ns"], codecs

    new = [runq(s) for s in range(40)]
    store = sink.ClickHouseSink(client)
    asyncio.run(store.write("runq_events", new))
    asyncio.run(store.write("runq_events", new[5:] + [runq(40)]))  # a redelivery, and one event more
    new.append(runq(40))
    truncated = [msgspec.structs.replace(r, ts_ns=r.ts_ns - r.ts_ns % 1000, wait_ns=r.wait_ns - r.wait_ns % 1000)
                 for r in new]
    assert stored(client, "h1") == truncated, "whole microseconds, every other field as sent"
    assert client.query("SELECT count() FROM jitterscope.runq_events WHERE host = 'h1'").result_rows == [(41,)]
    # readers that say wait_ns still read ns, and the rollup sums what is stored
    assert client.query("SELECT min(wait_ns), toUnixTimestamp64Nano(min(ts)) FROM jitterscope.runq_events "
                        "WHERE host = 'h1'").result_rows == [(12_345_000, T0 - T0 % 1000)]
    [[waited]] = client.query("SELECT sum(waited_ns) FROM jitterscope.runq_minute WHERE host = 'h1'").result_rows
    assert waited == sum(r.wait_ns for r in truncated)
    assert stored(client, "old") == old
    client.close()


def test_a_dense_days_run_queue_events_take_at_most_10_bytes_each(tmp_path):
    """The synthetic fleet's events at the per-host density of 100M a day over
    300 hosts (as bench/run.py storage), merged to one part per day: 11.4 B
    each before 015; the budget (issue 18) is 10."""
    client = clickhouse.connect(None, tmp_path)
    clickhouse.migrate(client)
    n = 1_000_000
    for sql in synthetic.runq_statements(300, n, 86400 * n // 100_000_000, time.time_ns()):
        client.command(sql, parameters={"suspects": synthetic.SUSPECTS})
    client.command("OPTIMIZE TABLE jitterscope.runq_events FINAL")
    rows, on_disk = client.query("SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = "
                                 "'jitterscope' AND table = 'runq_events' AND active").result_rows[0]
    assert rows == n
    assert on_disk / rows <= 10.0, f"{on_disk / rows:.2f} B per run-queue event"
    client.close()
