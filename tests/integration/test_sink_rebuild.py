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


def runq(host: str, seq: int) -> events.RunqEvent:
    return events.RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=time.time_ns(), pid=1, tid=1, comm="vllm", cpu=0,
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
