# SPDX-License-Identifier: Apache-2.0
"""Query values as text for people and programs: one rule for the worker's
/query page and for `jitterscope query`, so both print the same.

Timestamps are ISO 8601 in UTC with a ``Z``: clickhouse-connect returns a
DateTime column without a time zone as a naive datetime in UTC, and one with
a zone as an aware datetime; either way the reader sees the zone.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone


def iso_utc(value: datetime) -> str:
    """``2026-11-30T16:56:28.332Z``; naive datetimes are UTC (see above)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    text = value.astimezone(timezone.utc).isoformat(timespec="microseconds" if value.microsecond else "seconds")
    return text.removesuffix("+00:00") + "Z"


def plain(value):
    """A JSON-ready form of ``value`` (json.dumps' ``default``): timestamps as
    ISO 8601 UTC, dates as ISO dates, anything else (UUID, Decimal, IP
    addresses) as its text."""
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return value.decode(errors="replace")
    return str(value)


def text(value) -> str:
    """One cell of a table, CSV or TSV: NULL is empty, arrays and maps are
    JSON, timestamps ISO 8601 UTC."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=plain, ensure_ascii=False)
    if isinstance(value, (bool, int, float)):
        return str(value)
    return plain(value)
