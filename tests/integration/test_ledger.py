# SPDX-License-Identifier: Apache-2.0
"""`jitterscope ledger` against a real worker, then against the stopped store:
collector stats with known drops from two collector runs, data records with a
sequence gap and unstored records, and a dead letter, all made by hand."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import msgspec
import pytest
from confluent_kafka import Producer

from jitterscope.schemas import batches, events, topics
from tests.conftest import as_sent_before, wait_until

pytestmark = pytest.mark.integration

BOOT = "boot-ledger"
BASE1 = 1_000_000_000  # seq bases: microseconds since boot at each collector start
BASE2 = BASE1 + 50_000_000  # the second run started 50 s later


def stats(host: str, seq: int, started_ns: int, ringbuf: int, map_full: int, errors: int, spool: int,
          restarts: int, sent: dict[str, int]) -> events.CollectorStats:
    return events.CollectorStats(
        host=host, boot_id=BOOT, seq=seq, ts_ns=time.time_ns(), started_ns=started_ns, ringbuf_drops=ringbuf,
        events_read=1000, records_sent=sum(sent.values()), delivery_errors=errors, map_full_drops=map_full,
        spool_drops=spool, producer_restarts=restarts, sent_by_topic=sent)


def runq(host: str, seq: int, **kw) -> events.RunqEvent:
    fields = dict(host=host, boot_id=BOOT, seq=seq, ts_ns=time.time_ns(), pid=100, tid=101, comm="vllm", cpu=1,
                  wait_ns=2_000_000, suspect_pid=200, suspect_tid=200, suspect_comm="backup")
    return events.RunqEvent(**(fields | kw))


def ledger(stack, host: str) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "jitterscope.cli", "ledger", "--host", host, "-f", "json"],
                            env=stack.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_ledger_accounts_for_every_loss_exactly(stack):
    worker = stack.start_worker()
    host = f"ledger-{uuid.uuid4().hex[:8]}"
    t1, t2 = time.time_ns() - 60_000_000_000, time.time_ns() - 10_000_000_000
    # run 1: cumulative counters grow; the ledger takes the run's max (12 ring-buffer drops)
    run1 = [stats(host, BASE1, t1, 5, 0, 0, 0, 0, {topics.RUNQ: 3}),
            stats(host, BASE1 + 1, t1, 10, 1, 0, 0, 1, {topics.RUNQ: 6, topics.COLLECTOR_STATS: 1}),
            stats(host, BASE1 + 2, t1, 12, 2, 3, 1, 1, {topics.RUNQ: 8, topics.COLLECTOR_STATS: 2})]
    # run 2 starts from zero again: 9 drops more
    run2 = [stats(host, BASE2, t2, 7, 0, 0, 0, 0, {topics.RUNQ: 2}),
            stats(host, BASE2 + 1, t2, 9, 4, 1, 0, 2, {topics.RUNQ: 5, topics.COLLECTOR_STATS: 1})]
    # run 1 sent 8 runq records; 3 and 4 never arrive (a gap of 2); run 2 sent 5, all arrive.
    # The jump from run 1's last seq to run 2's base is a new run, not a gap.
    data = [runq(host, BASE1 + i) for i in (0, 1, 2, 5, 6, 7)] + [runq(host, BASE2 + i) for i in range(5)]
    poison = msgspec.json.encode(runq(host, BASE1 + 99)).replace(b'"pid":100', b'"pid":-1')

    producer = Producer({"bootstrap.servers": stack.broker.bootstrap_servers})
    key = host.encode()
    producer.produce(topics.COLLECTOR_STATS, batches.encode_batch(run1 + run2), key=key)
    producer.produce(topics.RUNQ, batches.encode_batch(data[:4]) + poison + b"\n", key=key)
    producer.produce(topics.RUNQ, batches.encode_batch(data[4:]), key=key)
    assert producer.flush(10) == 0

    def all_stored():
        n = stack.query("SELECT (SELECT count() FROM jitterscope.runq_events FINAL WHERE host = {h:String}), "
                        "(SELECT count() FROM jitterscope.collector_stats FINAL WHERE host = {h:String}), "
                        "(SELECT count() FROM jitterscope.deadletter FINAL WHERE payload LIKE {p:String})",
                        h=host, p=f"%{host}%")
        return n == [[11, 5, 1]]

    wait_until(all_stored, 90, "records, stats and the dead letter stored", worker)

    expected = {
        "host": host, "boot_id": BOOT,
        "collector_runs": 2,
        "ringbuf_drops": 12 + 9, "map_full_drops": 2 + 4, "delivery_errors": 3 + 1, "spool_drops": 1 + 0,
        "producer_restarts": 1 + 2,
        "dead_letters": 1,
        "seq_gaps": 1, "seq_missing": 2,
        "sent": (8 + 2) + (5 + 1),  # last sent_by_topic of each run, every topic
        "stored": 11 + 5,  # runq + collector_stats rows
        "unstored": 2,  # runq: 13 sent, 11 stored; stats: 3 sent, 5 stored (the last stats are not in a count yet)
    }
    assert ledger(stack, host) == [expected]

    # the same through the saved query, with its parameters bound
    saved = subprocess.run([sys.executable, "-m", "jitterscope.cli", "query", "--saved", "ledger", "-p",
                            f"host={host}", "-f", "json"], env=stack.env, capture_output=True, text=True, timeout=120)
    assert saved.returncode == 0, saved.stderr
    assert json.loads(saved.stdout) == [expected]

    # and on the stopped store, opened directly
    worker.stop()
    assert ledger(stack, host) == [expected]
    table = subprocess.run([sys.executable, "-m", "jitterscope.cli", "ledger", "--host", host],
                           env={**stack.env, "COLUMNS": "300"}, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert host in table.stdout and "ringbuf_drops" in table.stdout and " 21 " in table.stdout


def test_ledger_holes_inside_and_across_blocks(stack):
    """The ledger reads seqs from per-block bitmaps (2^20 seqs a block): a
    hole that straddles a block boundary and one inside a block both count."""
    from jitterscope.reports.ledger import BLOCK

    worker = stack.start_worker()
    host = f"ledger-{uuid.uuid4().hex[:8]}"
    edge = 1000 * BLOCK  # the first seq of a block
    kept = [edge - 3, edge - 2, edge + 1, edge + 2, edge + 5, edge + 6]  # holes: edge-1..edge, edge+3..edge+4
    producer = Producer({"bootstrap.servers": stack.broker.bootstrap_servers})
    key = host.encode()
    producer.produce(topics.COLLECTOR_STATS, batches.encode_batch(
        [stats(host, edge - 10, time.time_ns(), 0, 0, 0, 0, 0, {topics.RUNQ: 10})]), key=key)
    producer.produce(topics.RUNQ, batches.encode_batch([runq(host, s) for s in kept]), key=key)
    assert producer.flush(10) == 0
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.runq_events WHERE host = {h:String}",
                                   h=host) == [[len(kept)]], 90, "all runq records stored", worker)
    [row] = ledger(stack, host)
    assert (row["seq_gaps"], row["seq_missing"]) == (2, 4)
    assert (row["sent"], row["stored"], row["unstored"]) == (10, len(kept) + 1, 10 - len(kept))  # +1: the stats
    worker.stop()


def test_ledger_counts_rows_stored_before_its_migration(tmp_path, monkeypatch):
    """A store from before migration 009: its rows are backfilled into
    seq_blocks, and rows stored after it come through the views."""
    from jitterscope.reports import queries
    from jitterscope.streams import clickhouse

    client = clickhouse.connect(None, tmp_path)
    every = clickhouse.migrations()
    monkeypatch.setattr(clickhouse, "migrations", lambda: [m for m in every if m[0] < 9])
    clickhouse.migrate(client)
    clickhouse.insert_records(client, "runq_events",  # 017 added waits, 018 suspect_own
                              as_sent_before([runq("old-store", BASE1 + i) for i in (0, 1, 2, 5)],
                                             "waits", "suspect_own"))
    monkeypatch.setattr(clickhouse, "migrations", lambda: every)
    assert 9 in clickhouse.migrate(client)
    clickhouse.insert_records(client, "runq_events", [runq("old-store", BASE1 + 6)])
    sql, parameters = queries.bind("ledger", {"host": "old-store"})
    result = client.query(sql, parameters=parameters)
    [row] = [dict(zip(result.column_names, r)) for r in result.result_rows]
    assert (row["stored"], row["seq_gaps"], row["seq_missing"]) == (5, 1, 2)
    client.close()
