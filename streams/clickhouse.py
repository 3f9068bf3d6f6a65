# SPDX-License-Identifier: Apache-2.0
"""ClickHouse through one client: clickhouse-connect over HTTP to a server,
or with ``interface='chdb'`` to the embedded engine in this process.

chDB allows one process per data directory. The streams worker owns it while
it runs and serves other readers (``jitterscope query``) over its web port.
"""

from __future__ import annotations

import functools
import operator
import re
import time
from importlib import resources
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from jitterscope.common import errors
from jitterscope.common.private import private_dir
from jitterscope.schemas import events, signals

#: the database and each record type's table: the signal catalogue's (schemas/signals.py)
DATABASE = signals.DATABASE
TABLE_OF = signals.TABLE_OF

# Limits for untrusted, user-typed SQL; `readonly` must come last (it forbids
# changing settings after it).
READONLY_SETTINGS = {"max_execution_time": 60, "max_result_rows": 1_000_000, "readonly": 1}


def connect(clickhouse_url: str | None, data_dir: Path, readonly: bool = False):
    import os

    import clickhouse_connect

    settings = dict(READONLY_SETTINGS) if readonly else {}
    try:
        if clickhouse_url is None:
            # The store holds process command lines (secrets, at times):
            # only its owner may read it. Every folder made here is 0700
            # (common/private.py); a store made before this rule is
            # tightened by its owner's writer.
            path = data_dir / "clickhouse"
            private_dir(path)  # and the data dir, and any folder above it it makes
            if not readonly and path.stat().st_uid == os.geteuid():
                path.chmod(0o700)
            return clickhouse_connect.get_client(interface="chdb", path=str(path), settings=settings)
        url = urlparse(clickhouse_url)
        return clickhouse_connect.get_client(
            host=url.hostname or "localhost", port=url.port or 8123, username=url.username or "default",
            password=url.password or "", secure=url.scheme == "https", settings=settings)
    except PermissionError as exc:
        raise errors.NotPrivileged(f"you cannot use {exc.filename or data_dir}: run as the user that owns "
                                   "the store (root?)") from exc
    except Exception as exc:
        where = clickhouse_url or f"embedded chDB at {data_dir / 'clickhouse'}"
        hint = ("another process (a running streams worker?) holds it; query through "
                "'jitterscope query' or stop that process" if clickhouse_url is None
                else "check the URL and that the server is up")
        raise errors.ClickHouseUnavailable(f"cannot open ClickHouse ({where}): {exc}; {hint}") from exc


def connect_with_retry(clickhouse_url: str | None, data_dir: Path, timeout_s: float = 30.0, **kw):
    """connect(), retried: a short-lived reader (`jitterscope query`) may hold
    the chDB directory for a moment, and a server may still be starting."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return connect(clickhouse_url, data_dir, **kw)
        except errors.ClickHouseUnavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of schemas/clickhouse/NNN_name.sql, in order."""
    folder = resources.files("jitterscope.schemas").joinpath("clickhouse")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d+)_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text()))
    return sorted(found)


def split_statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def migrate(client) -> list[int]:
    """Apply migrations not yet recorded; returns the versions applied."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {DATABASE}.schema_migrations "
        "(version UInt32, name String, applied_at DateTime DEFAULT now()) "
        "ENGINE = ReplacingMergeTree ORDER BY version")
    done = {row[0] for row in client.query(f"SELECT version FROM {DATABASE}.schema_migrations").result_rows}
    applied = []
    for version, name, sql in migrations():
        if version in done:
            continue
        for statement in split_statements(sql):
            client.command(statement)
        client.insert(f"{DATABASE}.schema_migrations", [(version, name)], column_names=["version", "name"])
        applied.append(version)
    return applied


def _column_value(value):
    if isinstance(value, list) and value and isinstance(value[0], msgspec.Struct):
        return [msgspec.structs.astuple(v) for v in value]
    return value


#: epoch-ns fields stored as DateTime64(9) columns, under these names
TIME_COLUMNS = {"ts_ns": "ts", "raised_ns": "raised"}


def _columns(record_type: type[msgspec.Struct]) -> list[tuple[str, str]]:
    """(struct field, column) pairs: every field but the version."""
    return [(f, TIME_COLUMNS.get(f, f)) for f in record_type.__struct_fields__ if f != "v"]


@functools.cache
def _column_plan(record_type: type[msgspec.Struct]) -> tuple[list[str], list[tuple[operator.attrgetter, bool]]]:
    """Column names, and per column its getter and whether its values are
    lists of structs (they go in as tuples: ClickHouse Tuple/Nested)."""
    info = msgspec.inspect.type_info(record_type)
    assert isinstance(info, msgspec.inspect.StructType)  # a record type, never a plain value
    nested = {f.name for f in info.fields
              if any(isinstance(t, msgspec.inspect.ListType) and isinstance(t.item_type, msgspec.inspect.StructType)
                     for t in (f.type.types if isinstance(f.type, msgspec.inspect.UnionType) else (f.type,)))}
    pairs = _columns(record_type)
    return [c for _, c in pairs], [(operator.attrgetter(f), f in nested) for f, _ in pairs]


#: table -> ns fields stored truncated to whole microseconds (migration 015's
#: contract: the columns stay ns, their GCD codec stores what is left as us)
MICROSECOND_FIELDS = {"runq_events": frozenset({"ts_ns", "wait_ns"})}


def _to_microseconds(values: list[int]) -> list[int]:
    return [v - v % 1000 for v in values]


def insert_records(client, table: str, records: list[msgspec.Struct]) -> None:
    """Column-oriented insert of records of one type. Columns are built with
    one C-level map per column (no Python call per value): at 100k+ records
    a second the per-value work is the sink's own cost. Fields of
    MICROSECOND_FIELDS[table] are truncated to whole microseconds here, at
    the one place records are stored, so the stream keeps its ns."""
    if not records:
        return
    names, plan = _column_plan(type(records[0]))
    data = [[_column_value(v) for v in map(get, records)] if nested else list(map(get, records))
            for get, nested in plan]
    if coarse := MICROSECOND_FIELDS.get(table):
        fields = [f for f, _ in _columns(type(records[0]))]
        data = [_to_microseconds(column) if field in coarse else column for field, column in zip(fields, data)]
    client.insert(f"{DATABASE}.{table}", data, column_names=names, column_oriented=True)


def select_records(client, record_type: type[events.Record], where: str = "1", parameters: dict | None = None,
                   limit: int = 1_000_000) -> list:
    """Read rows back as records (the inverse of insert_records). ``where`` is
    SQL written by this program; values go in ``parameters``."""
    pairs = _columns(record_type)
    table = TABLE_OF[record_type]
    select = ", ".join(f"toUnixTimestamp64Nano({c}) AS {f}" if f in TIME_COLUMNS else c for f, c in pairs)
    result = client.query(f"SELECT {select} FROM {DATABASE}.{table} FINAL WHERE {where} LIMIT {int(limit)}",
                          parameters=parameters)
    names = [f for f, _ in pairs]
    return [msgspec.convert(dict(zip(names, row)), record_type) for row in result.result_rows]


def cluster_ddl(cluster: str = "{cluster}") -> list[str]:
    """The migrations rewritten for a replicated, sharded ClickHouse cluster:
    each table becomes a Replicated*MergeTree ``<name>_local`` on every node
    plus a Distributed ``<name>`` sharded by host (so one host's rows, and its
    rollups, stay on one shard); views read and write the local tables; every
    statement runs ON CLUSTER. One DDL source, two deployments."""
    on = f"ON CLUSTER '{cluster}'"
    out = [f"CREATE DATABASE IF NOT EXISTS {DATABASE} {on}"]
    for _version, _name, sql in migrations():
        for statement in split_statements(sql):
            if match := re.match(rf"CREATE TABLE IF NOT EXISTS {DATABASE}\.(\w+) \(", statement):
                table = match[1]
                local = statement.replace(f"{DATABASE}.{table} (", f"{DATABASE}.{table}_local {on} (", 1)
                local = re.sub(r"ENGINE = (\w*MergeTree)\b",
                               lambda m: f"ENGINE = Replicated{m[1]}('/clickhouse/tables/{{shard}}/{DATABASE}/"
                                         f"{table}', '{{replica}}')", local, count=1)
                out.append(local)
                out.append(f"CREATE TABLE IF NOT EXISTS {DATABASE}.{table} {on} AS {DATABASE}.{table}_local "
                           f"ENGINE = Distributed('{cluster}', '{DATABASE}', '{table}_local', cityHash64(host))")
            elif match := re.match(rf"CREATE MATERIALIZED VIEW IF NOT EXISTS {DATABASE}\.(\w+) TO {DATABASE}\.(\w+) AS",
                                   statement):
                name = match[1]
                view = re.sub(rf"{DATABASE}\.(\w+)", lambda m: m[0] if m[1] == name else f"{m[0]}_local", statement)
                out.append(view.replace(f"{DATABASE}.{name} TO", f"{DATABASE}.{name} {on} TO", 1))
            elif statement.startswith(f"INSERT INTO {DATABASE}."):
                continue  # a backfill of an existing store: a new cluster has nothing to fill
            elif match := re.match(rf"ALTER TABLE {DATABASE}\.(\w+) (.*)", statement, re.S):
                out.append(f"ALTER TABLE {DATABASE}.{match[1]}_local {on} {match[2]}")
                out.append(f"ALTER TABLE {DATABASE}.{match[1]} {on} {match[2]}")
            else:
                raise ValueError(f"no cluster form for: {statement[:80]}")
    return out


#: tables whose rows age out by ``ts`` (day-partitioned time series)
RETAINABLE = ("runq_events", "latency_histograms", "requests", "request_attribution", "alerts", "deadletter",
              "gpu_ioctls", "migrations", "page_placement", "device_io", "collector_stats", "processes", "topology",
              "irq_time", "cgroup_throttle", "stacks", "gpu_xid", "gpu_telemetry")


def retention_statements(retention_days: dict[str, int], cluster: str | None = None) -> list[str]:
    """Per-table TTL from settings (``retention_days``): N > 0 keeps N days, 0
    keeps rows forever. Rollups are tables too (latency_minute,
    attribution_minute: by ``minute``). On a cluster (``cluster_ddl``) the
    rows live in the Replicated ``<table>_local`` tables, so the TTL goes
    there, ON CLUSTER; the Distributed table holds no rows and takes no TTL."""
    statements = []
    for table, days in sorted(retention_days.items()):
        column = "minute" if table in ("latency_minute", "attribution_minute") else "ts"
        if table not in RETAINABLE and column == "ts":
            raise errors.BadConfig(f"retention_days: no table {table!r}; one of {', '.join(RETAINABLE)}, "
                                   "latency_minute, attribution_minute")
        target = f"{DATABASE}.{table}" if cluster is None else f"{DATABASE}.{table}_local ON CLUSTER '{cluster}'"
        action = (f"MODIFY TTL toDateTime({column}) + INTERVAL {int(days)} DAY" if int(days) > 0 else "REMOVE TTL")
        statements.append(f"ALTER TABLE {target} {action}")
    return statements


def apply_retention(client, retention_days: dict[str, int], cluster: str | None = None) -> None:
    """``retention_statements``, applied; idempotent."""
    for statement in retention_statements(retention_days, cluster):
        client.command(statement)
