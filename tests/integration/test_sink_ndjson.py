# SPDX-License-Identifier: Apache-2.0
"""The sink's raw path (streams/sink.py ``write(..., raw=)``,
streams/clickhouse.py ``insert_ndjson``) on real chDB: NDJSON lines stored as
they came give the same rows as the decoded records, omitted fields included;
a message with a bad line keeps the decoded path, its bad line set apart and
every other record stored; lines ClickHouse's reader refuses are stored
decoded; a redelivered batch still feeds the rollups once."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from jitterscope.schemas import batches, events, topics
from jitterscope.streams import clickhouse, sink
from tests.integration.test_streams_faults import example

pytestmark = pytest.mark.integration

NASTY = 'a"b\\c\'d \u202e\x1b[31m\u00e9\U0001f600'  # escapes both JSON readers must read alike
FLAT = sorted((t for t in topics.INPUT_TOPICS.values()
               if clickhouse.ndjson_plan(t, clickhouse.TABLE_OF[t]) is not None), key=lambda t: t.__name__)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    client = clickhouse.connect(None, tmp_path_factory.mktemp("ndjson"))
    clickhouse.migrate(client)
    yield client
    client.close()


@pytest.fixture()
def store(client, monkeypatch):
    """(client, a fresh sink, how many inserts went each way); each test its own hosts."""
    calls = {"raw": 0, "decoded": 0}
    raw, decoded = clickhouse.insert_ndjson, clickhouse.insert_records

    def count_raw(*args):
        stored = raw(*args)
        calls["raw"] += stored
        return stored

    def count_decoded(*args, **kw):
        calls["decoded"] += 1
        return decoded(*args, **kw)

    monkeypatch.setattr(clickhouse, "insert_ndjson", count_raw)
    monkeypatch.setattr(clickhouse, "insert_records", count_decoded)
    yield client, sink.ClickHouseSink(client), calls


def varied(record_type: type[events.Record], host: str, n: int, omit: bool) -> list[dict]:
    """``n`` valid records as dicts, strings nasty, every optional field set
    to a value other than its default (or, with ``omit``, left out)."""
    info = msgspec.inspect.type_info(record_type).fields
    out = []
    for i in range(n):
        record = example(record_type, host, i, ts_ns=1_780_000_000_123_456_789 + i * 1_000_003)
        record.update({name: NASTY + str(i) for name, value in record.items()
                       if isinstance(value, str) and name not in ("host", "boot_id")})
        for field in info:
            if not field.required and field.name != "v" and not omit:
                record[field.name] = {bool: lambda d: not d, str: lambda d: d + NASTY}.get(
                    type(field.default), lambda d: d + 3)(field.default)
        out.append(record)
    return out


def rows(client, record_type, host: str) -> list[dict]:
    """``host``'s stored records, host left out, by seq."""
    return sorted((msgspec.structs.asdict(r) | {"host": ""} for r in clickhouse.select_records(
        client, record_type, "host = {h:String}", {"h": host})), key=lambda r: r["seq"])


@pytest.mark.parametrize("omit", [False, True], ids=["every-field", "defaults-omitted"])
@pytest.mark.parametrize("record_type", FLAT, ids=lambda t: t.__name__)
def test_lines_stored_as_sent_give_the_rows_the_decoded_records_give(store, record_type, omit):
    client, writer, calls = store
    table = clickhouse.TABLE_OF[record_type]
    decoder = batches.BatchDecoder(record_type)
    for host, raw in ((f"decoded-{omit}", False), (f"raw-{omit}", True)):
        payload = b"".join(msgspec.json.encode(r) + b"\n" for r in varied(record_type, host, 30, omit))
        records, bad = decoder.decode(payload)
        assert bad == [] and len(records) == 30
        asyncio.run(writer.write(table, records, raw=payload if raw else None))
    assert calls == {"raw": 1, "decoded": 1}, "one write each way"
    assert rows(client, record_type, f"raw-{omit}") == rows(client, record_type, f"decoded-{omit}")


def test_a_bad_line_keeps_its_message_decoded_and_costs_no_other_record(store):
    client, writer, calls = store
    decoder = batches.BatchDecoder(events.RunqEvent)
    good = [batches.encode_batch([events.RunqEvent(**r) for r in varied(events.RunqEvent, "bad-line", 5, False)][k::3])
            for k in range(3)]
    mixed = good[1].replace(b"\n", b"\n{\"v\":1,\"host\":\n", 1)  # a cut line after its first record
    parts = []
    for payload in (good[0], mixed, good[2]):
        records, bad = decoder.decode(payload)
        parts.append((records, None if bad else payload))
        if payload is mixed:
            assert [b.payload for b in bad] == [b'{"v":1,"host":']
    chunks = sink.raw_chunks(parts, step=2)
    assert [(len(r), raw is not None) for r, raw in chunks] == [(2, True), (2, False), (1, True)]
    for records, raw in chunks:
        asyncio.run(writer.write("runq_events", records, raw=raw))
    assert calls == {"raw": 2, "decoded": 1}
    assert client.query("SELECT count() FROM jitterscope.runq_events WHERE host = 'bad-line'").result_rows == [(5,)]


def test_lines_the_reader_refuses_are_stored_decoded(store):
    client, writer, calls = store
    line = msgspec.json.encode(example(events.RunqEvent, "refused", 1))
    twice = line[:-1] + b',"pid":7}\n'  # a key given twice: msgspec takes the last, ClickHouse refuses the line
    records, bad = batches.BatchDecoder(events.RunqEvent).decode(twice)
    assert bad == [] and records[0].pid == 7
    asyncio.run(writer.write("runq_events", records, raw=twice))
    assert calls == {"raw": 0, "decoded": 1}
    assert client.query("SELECT pid FROM jitterscope.runq_events WHERE host = 'refused'").result_rows == [(7,)]


def test_a_redelivered_batch_of_lines_feeds_the_rollup_once(store):
    client, writer, calls = store
    decoder = batches.BatchDecoder(events.RunqEvent)
    first = b"".join(msgspec.json.encode(r) + b"\n" for r in varied(events.RunqEvent, "again", 20, True))
    records, _ = decoder.decode(first)
    asyncio.run(writer.write("runq_events", records, raw=first))
    asyncio.run(writer.write("runq_events", records[5:], raw=b"".join(first.splitlines(keepends=True)[5:])))
    assert calls == {"raw": 1, "decoded": 1}, "the redelivery's stored rows are dropped, decoded"
    assert client.query("SELECT count(), (SELECT sum(waits) FROM jitterscope.runq_minute WHERE host = 'again') "
                        "FROM jitterscope.runq_events WHERE host = 'again'").result_rows == [(20, 20)]


def test_chunks_hold_whole_messages_and_end_every_line():
    parts = [([1, 2], b"a\nb\n"), ([3], b"c"), ([4, 5, 6], b"d\ne\nf\n"), ([7], None), ([8], b"h\n")]
    assert sink.raw_chunks(parts, step=3) == [([1, 2, 3], b"a\nb\nc\n"), ([4, 5, 6], b"d\ne\nf\n"),
                                              ([7, 8], None)]
    assert sink.raw_chunks([([1, 2, 3, 4], b"a\nb\nc\nd\n")], step=2) == [([1, 2, 3, 4], b"a\nb\nc\nd\n")]


def test_a_server_and_a_nested_type_keep_the_decoded_path():
    line = msgspec.json.encode(example(events.RunqEvent, "server", 1)) + b"\n"
    assert not clickhouse.insert_ndjson(object(), "runq_events", events.RunqEvent, line), "nothing asked of a server"
    assert clickhouse.ndjson_plan(events.Topology, "topology") is None
