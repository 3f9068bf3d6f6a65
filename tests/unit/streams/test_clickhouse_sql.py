# SPDX-License-Identifier: Apache-2.0
"""streams/clickhouse.py pure helpers: migration files, statement splitting,
record field -> column mapping, the values insert_records sends. No
ClickHouse is opened."""

import re

from jitterscope.schemas import events
from jitterscope.streams.clickhouse import TABLE_OF, _columns, migrations, split_statements


def test_split_statements_drops_comments_and_splits():
    sql = """
-- 001: header comment; with a semicolon
CREATE TABLE a (x UInt8) ENGINE = Memory;

   -- indented comment
CREATE TABLE b (
    y String
) ENGINE = Memory;
"""
    assert split_statements(sql) == [
        "CREATE TABLE a (x UInt8) ENGINE = Memory",
        "CREATE TABLE b (\n    y String\n) ENGINE = Memory",
    ]


def test_split_statements_without_trailing_semicolon_and_empty():
    assert split_statements("SELECT 1;\nSELECT 2") == ["SELECT 1", "SELECT 2"]
    assert split_statements("") == []
    assert split_statements("-- only a comment\n;\n  ;") == []


def test_migrations_are_numbered_and_in_order():
    found = migrations()
    assert found, "no schemas/clickhouse/NNN_name.sql found"
    versions = [v for v, _, _ in found]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert versions[0] == 1
    for version, name, sql in found:
        assert re.fullmatch(r"\w+", name)
        assert sql.strip()


def test_every_migration_statement_is_idempotent():
    """Migrations must survive being re-run after a crash halfway through."""
    for version, name, sql in migrations():
        statements = split_statements(sql)
        assert statements, f"{version}_{name} has no statements"
        for statement in statements:
            # setting a column's codec again to the same codec changes nothing: idempotent too
            codecs_only = re.fullmatch(r"ALTER TABLE \S+ (MODIFY COLUMN \w+ CODEC\((\w+(\(\d+\))?(, )?)+\),?\s*)+",
                                       statement)
            # a backfill of seq_blocks: its rows are set unions (bitmaps) and maxima, so a second run adds nothing
            backfill = statement.startswith("INSERT INTO jitterscope.seq_blocks\n")
            assert codecs_only or backfill or re.match(
                r"(CREATE (\w+ )+IF NOT EXISTS|ALTER TABLE \S+ ADD COLUMN IF NOT EXISTS)", statement), \
                f"{version}_{name}: {statement[:60]!r}"


def test_migrations_create_every_record_table():
    sql = "\n".join(m[2] for m in migrations())
    for table in TABLE_OF.values():
        assert f"CREATE TABLE IF NOT EXISTS jitterscope.{table} " in sql


def test_columns_rename_times_and_leave_out_version():
    pairs = dict(_columns(events.Alert))
    assert "v" not in pairs
    assert pairs["ts_ns"] == "ts"
    assert pairs["raised_ns"] == "raised"
    assert pairs["wait_ns"] == "wait_ns"  # a duration, not a time: unchanged
    assert pairs["host"] == "host"


def test_columns_cover_every_field_but_v_in_order():
    pairs = _columns(events.RunqEvent)
    fields = [f for f in events.RunqEvent.__struct_fields__ if f != "v"]
    assert [f for f, _ in pairs] == fields
    assert "ts" in [c for _, c in pairs]
    assert "ts_ns" not in [c for _, c in pairs]


class _Recorder:
    """Stands in for a client's insert only: what insert_records would send."""

    def insert(self, table, data, column_names, column_oriented):
        self.sent = (table, dict(zip(column_names, data)))


def test_only_run_queue_times_and_waits_are_stored_in_whole_microseconds():
    from jitterscope.streams.clickhouse import insert_records

    runq = events.RunqEvent(host="h", boot_id="b", seq=1, ts_ns=1_000_000_123_456_789, pid=2, tid=3, comm="c",
                            cpu=1, wait_ns=12_345_999, suspect_pid=4_001, suspect_tid=5, suspect_comm="s")
    client = _Recorder()
    insert_records(client, "runq_events", [runq])
    assert client.sent[1]["ts"] == [1_000_000_123_456_000] and client.sent[1]["wait_ns"] == [12_345_000]
    assert client.sent[1]["suspect_pid"] == [4_001] and client.sent[1]["seq"] == [1]
    assert runq.ts_ns == 1_000_000_123_456_789, "the record itself (the stream's) keeps its ns"
    insert_records(client, "some_other_table", [runq])
    assert client.sent[1]["ts"] == [1_000_000_123_456_789] and client.sent[1]["wait_ns"] == [12_345_999]
