# SPDX-License-Identifier: Apache-2.0
"""The sink's takeover rebuild (streams/sink.py) on the real engine: every
rollup fed by a source is rebuilt from it, the seq bitmaps are fed again, and a
rebuild that fails does not cost the records being stored."""

from __future__ import annotations

import asyncio
import time

import pytest

from jitterscope.schemas import events
from jitterscope.streams import clickhouse
from jitterscope.streams.sink import ClickHouseSink

pytestmark = pytest.mark.integration


T0 = time.time_ns()


def runq(host: str, seq: int) -> events.RunqEvent:
    """The same record each time it is asked for (a redelivery): its time is its seq's."""
    return events.RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=T0 + seq * 1_000_000, pid=1, tid=1, comm="vllm", cpu=0,
                            wait_ns=7_000_000, suspect_pid=2, suspect_tid=2, suspect_comm="backup")


def stored(client, host: str) -> list:
    return client.query(
        "SELECT (SELECT count() FROM jitterscope.runq_events FINAL WHERE host = {h:String}), "
        "(SELECT sum(waits) FROM jitterscope.runq_minute WHERE host = {h:String}), "
        "(SELECT groupBitmapMerge(seqs) FROM jitterscope.seq_blocks WHERE host = {h:String})",
        parameters={"h": host}).result_rows[0]


def test_takeover_rebuilds_rollups_and_survives_a_broken_one(tmp_path):
    client = clickhouse.connect(None, tmp_path)
    clickhouse.migrate(client)
    # rows a killed worker stored without its views seeing them: in the source only
    clickhouse.insert_records(client, "runq_events", [runq("h1", s) for s in range(3)])
    client.command("TRUNCATE TABLE jitterscope.runq_minute")
    client.command("TRUNCATE TABLE jitterscope.seq_blocks")
    sink = ClickHouseSink(client)
    asyncio.run(sink.write("runq_events", [runq("h1", 3)]))
    assert list(stored(client, "h1")) == [4, 4, 4], "the takeover rebuilds runq_minute and feeds seq_blocks again"

    # a rollup the rebuild cannot handle (no minute column): logged, and the records are still stored
    client.command("CREATE TABLE jitterscope.odd (host String, n UInt64) ENGINE = MergeTree ORDER BY host")
    client.command("CREATE MATERIALIZED VIEW jitterscope.odd_mv TO jitterscope.odd AS "
                   "SELECT host, count() AS n FROM jitterscope.runq_events GROUP BY host")
    clickhouse.insert_records(client, "runq_events", [runq("h2", 0)])
    asyncio.run(sink.write("runq_events", [runq("h2", 1)]))
    assert stored(client, "h2")[0] == 2
    sink.close()
    client.close()


def test_only_batches_reaching_back_to_what_is_stored_are_looked_up(tmp_path):
    """From its takeover on, the sink knows each (host, boot_id)'s highest
    stored seq: a redelivered or replayed batch is still deduplicated (the
    rollups stay exact) and a fresh one is not looked up at all."""
    client = clickhouse.connect(None, tmp_path)
    clickhouse.migrate(client)
    clickhouse.insert_records(client, "runq_events", [runq("h1", s) for s in range(5)])  # a previous owner's rows
    sink = ClickHouseSink(client)
    lookups = []
    real_query = client.query

    def counting(sql, *args, **kwargs):
        if "SELECT host, boot_id, seq FROM" in sql:
            lookups.append(sql)
        return real_query(sql, *args, **kwargs)

    client.query = counting
    asyncio.run(sink.write("runq_events", [runq("h1", s) for s in range(3, 8)]))  # takeover: reaches back
    assert stored(client, "h1")[:2] == (8, 8) and len(lookups) == 1
    asyncio.run(sink.write("runq_events", [runq("h1", s) for s in range(8, 12)]))  # above: no look-up
    assert stored(client, "h1")[:2] == (12, 12) and len(lookups) == 1
    asyncio.run(sink.write("runq_events", [runq("h1", s) for s in (2, 11, 12, 12)]))  # a replay, a repeat in it
    assert stored(client, "h1")[:2] == (13, 13) and len(lookups) == 2
    # a rebalance handed the host to another worker and back: it may have stored more meanwhile
    sink.forget_hosts()
    clickhouse.insert_records(client, "runq_events", [runq("h1", s) for s in range(13, 20)])
    client.command("TRUNCATE TABLE jitterscope.runq_minute")
    asyncio.run(sink.write("runq_events", [runq("h1", s) for s in range(18, 22)]))
    assert stored(client, "h1")[:2] == (22, 22), "taken over afresh: rebuilt, and 18-19 not inserted twice"
    sink.close()
    client.close()
