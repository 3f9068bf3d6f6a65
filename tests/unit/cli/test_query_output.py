# SPDX-License-Identifier: Apache-2.0
"""Pure pieces behind `jitterscope query`'s output (issue 12): which FORMAT a
query names, how values become text, and the settings checks that refuse a
bad ClickHouse URL."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from jitterscope.common import errors, settings, values
from jitterscope.streams import readonly_sql


@pytest.mark.parametrize("sql, expected", [
    ("SELECT 1 FORMAT TSV", "TSV"),
    ("select 1 format JSONEachRow;", "JSONEachRow"),
    ("SELECT 1 FORMAT `CSVWithNames` -- trailing comment", "CSVWithNames"),
    ("SELECT * FROM format(CSV, 'a\n1')", None),  # the table function
    ("SELECT format FROM t", None),
    ("SELECT 1 AS format", None),
    ("SELECT 'FORMAT TSV'", None),
])
def test_output_format_is_only_a_trailing_clause(sql, expected):
    assert readonly_sql.output_format(sql) == expected


def test_iso_utc_gives_every_timestamp_its_zone():
    assert values.iso_utc(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"  # naive: UTC
    tokyo = timezone(timedelta(hours=9))
    assert values.iso_utc(datetime(2026, 1, 2, 3, 4, 5, 250000, tzinfo=tokyo)) == "2026-01-01T18:04:05.250000Z"


def test_text_cells_are_plain():
    assert values.text(None) == ""
    assert values.text(["a", 1]) == '["a", 1]' and values.text({"k": "v"}) == '{"k": "v"}'
    assert values.text(date(2026, 1, 2)) == "2026-01-02"
    assert values.text([datetime(2026, 1, 2)]) == '["2026-01-02T00:00:00Z"]'


@pytest.mark.parametrize("url", ["notaurl", "localhost:8123", "ftp://ch:8123", "http://", "http://ch:port"])
def test_a_clickhouse_url_must_be_http_with_a_host(url, monkeypatch):
    monkeypatch.delenv("JITTERSCOPE_CONFIG", raising=False)
    with pytest.raises(errors.BadConfig, match="clickhouse_url"):
        settings.load(None, clickhouse_url=url)


def test_good_clickhouse_urls_load(monkeypatch):
    monkeypatch.delenv("JITTERSCOPE_CONFIG", raising=False)
    for url in ("http://ch:8123", "https://user:secret@ch.example.com:8443", "http://[::1]:8123"):
        assert settings.load(None, clickhouse_url=url).clickhouse_url == url


def test_a_worker_bound_to_one_address_is_dialled_there_and_a_wildcard_on_loopback():
    from jitterscope.query import Worker, dial_host

    assert Worker(6066, "t", "10.0.0.5").url == "http://10.0.0.5:6066"
    assert dial_host("0.0.0.0") == dial_host("::") == dial_host("") == "127.0.0.1"
    assert dial_host("fd00::5") == "[fd00::5]"
    assert Worker(6066, "t").url == "http://127.0.0.1:6066"  # a state file from before the bind was recorded
