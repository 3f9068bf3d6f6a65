# SPDX-License-Identifier: Apache-2.0
"""The commands that read jitterscope's ClickHouse and print rows: `query`
(any read-only SQL, or a saved query), `ledger` (where records were lost) and
`stacks` (the code behind run-queue waits), and how their rows print.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from jitterscope.common import errors
from jitterscope.options import ClickHouseOpt, ConfigOpt, DataDirOpt, SetOpt, console, err_console, load_settings


def query(
    sql: Annotated[Optional[str], typer.Argument(
        help="SQL to run (read-only), e.g. \"SELECT count() FROM jitterscope.runq_events\"")] = None,
    saved: Annotated[Optional[str], typer.Option("--saved", "-s", help="run a saved fleet query by name")] = None,
    list_saved: Annotated[bool, typer.Option(
        "--list-saved", help="list the saved queries and their parameters")] = False,
    param: Annotated[Optional[list[str]], typer.Option(
        "--param", "-p", help="bind NAME=VALUE for {NAME:Type} placeholders (repeatable)")] = None,
    fmt: Annotated[Optional[str], typer.Option(
        "--format", "-f", help="table (default), csv, tsv, json or ndjson; or end the SQL in ClickHouse's "
                               "FORMAT <name>")] = None,
    sets: SetOpt = None,
    config: ConfigOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Answer SQL from jitterscope's ClickHouse (through the running worker when there is one)."""
    from jitterscope.query import run_query, run_raw
    from jitterscope.reports import queries
    from jitterscope.streams import readonly_sql

    if list_saved:
        for q in queries.SAVED.values():
            params = {**queries.COMMON, **q.params}
            console.print(f"[bold]{q.name}[/]  {q.question}", highlight=False)
            console.print("    params: " + ", ".join(
                f"{k}={d}" + (f" (one of {'|'.join(q.choices[k])})" if k in q.choices else "")
                for k, (_t, d) in params.items()), markup=False, soft_wrap=True)
        return
    if (sql is None) == (saved is None):
        raise errors.BadConfig("give either SQL or --saved NAME (see --list-saved)")
    _check_format(fmt)
    parameters = {}
    for item in param or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise errors.BadConfig(f"--param {item!r} is not NAME=VALUE")
        parameters[name] = value
    if saved:
        sql, parameters = queries.bind(saved, parameters)
    s = load_settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
    readonly_sql.check(sql, parameters)  # before reading FORMAT from it
    own_format = readonly_sql.output_format(sql)
    if own_format:  # as every ClickHouse user types it: ClickHouse's own bytes, passed through
        if fmt:
            raise errors.BadConfig(f"the query ends in FORMAT {own_format} and -f {fmt} was given: use one of them")
        sys.stdout.buffer.write(run_raw(s, sql, parameters))
        sys.stdout.flush()
        return
    _print_rows(*run_query(s, sql, parameters), fmt or "table")


FORMATS = ("table", "csv", "tsv", "json", "ndjson")


def _check_format(fmt: str | None) -> None:
    if fmt is not None and fmt not in FORMATS:
        raise errors.BadConfig(f"unknown --format {fmt!r}: use {', '.join(FORMATS)}")


def _tsv_cell(value) -> str:
    """ClickHouse's TabSeparated escaping, so `cut -f` and ClickHouse read it back."""
    from jitterscope.common.values import text

    if value is None:
        return "\\N"
    return text(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _print_rows(columns: list[str], rows: list[list], fmt: str) -> None:
    """Query results as a table for people, or CSV/TSV/JSON/NDJSON for
    programs (those keep values exact: JSON escapes control characters
    itself, CSV and TSV are data). Timestamps are ISO 8601 UTC everywhere."""
    from jitterscope.common.values import plain, text

    if fmt == "json":
        print(json.dumps([dict(zip(columns, r)) for r in rows], default=plain))
    elif fmt == "ndjson":
        for row in rows:
            print(json.dumps(dict(zip(columns, row)), default=plain))
    elif fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([text(v) for v in row] for row in rows)
        print(out.getvalue(), end="")
    elif fmt == "tsv":
        for row in [columns, *rows]:
            print("\t".join(map(_tsv_cell, row)))
    else:
        from rich.markup import escape
        from rich.table import Table

        from jitterscope.common.logs import printable

        table = Table(*map(printable, columns))
        for row in rows:
            # values are data: never rich markup, never terminal escape sequences
            table.add_row(*(escape(printable(text(v))) for v in row))
        # piped, a table keeps its full width (rich would cut it to 80 columns)
        out = console if sys.stdout.isatty() else Console(highlight=False, width=1_000_000)
        out.print(table, crop=False)
    if not rows:  # on stderr: the output stays what a program expects
        err_console.print("0 rows")


def ledger(
    since: Annotated[str, typer.Option(help="boots active in this period: 30m, 24h, 7d, ...")] = "7d",
    host: Annotated[Optional[str], typer.Option("--host", help="only this host (default: every host)")] = None,
    limit: Annotated[int, typer.Option(help="rows at most")] = 1000,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv, tsv, json or ndjson")] = "table",
    sets: SetOpt = None,
    config: ConfigOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Account for every lost record, per host and boot: kernel drops, producer and spool failures,
    dead letters, sequence gaps, and sent against stored (the saved query 'ledger')."""
    from jitterscope.query import run_query
    from jitterscope.reports import queries

    _check_format(fmt)
    sql, parameters = queries.bind("ledger", {"since": since, "host": host or "", "limit": str(limit)})
    s = load_settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
    _print_rows(*run_query(s, sql, parameters), fmt)


def stacks(
    since: Annotated[str, typer.Option(help="period covered: 30m, 24h, 7d, ... (unless --start)")] = "24h",
    start: Annotated[Optional[str], typer.Option(help="from this moment (ISO 8601, UTC if no zone)")] = None,
    end: Annotated[Optional[str], typer.Option(help="until this moment (ISO 8601; default now)")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="only this host (default: every host)")] = None,
    victim: Annotated[bool, typer.Option(
        "--victim", help="the waiters' stacks when preempted, instead of the culprits' (who held the CPU)")] = False,
    limit: Annotated[int, typer.Option(help="stacks at most")] = 20,
    own: Annotated[bool, typer.Option("--own", help="also jitterscope's own processes as culprits "
                                                    "(the cost of watching; left out by default)")] = False,
    folded: Annotated[bool, typer.Option(
        "--folded", help="folded stacks for flame graphs ('frame;frame count', count = microseconds of wait)")] = False,
    alert: Annotated[Optional[int], typer.Option(
        "--alert", help="the stacks of one run-queue alert: its seq (with --host)")] = None,
    sets: SetOpt = None,
    config: ConfigOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """The code behind run-queue waits: top culprit stacks by the wait they caused, one alert's stacks, folded output."""  # noqa: E501 (--help shows its line breaks)
    from jitterscope import stacks as stacks_cmd
    from jitterscope.common.logs import printable
    from jitterscope.query import run_query

    s = load_settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
    stacks_cmd.run(lambda sql, params: run_query(s, sql, {k: str(v) for k, v in params.items()})[1],
                   lambda line: print(printable(line)), since=since, start=start, end=end, host=host,
                   victim=victim, limit=limit, folded=folded, alert=alert, own=own)

