# SPDX-License-Identifier: Apache-2.0
"""jitterscope: find the kernel-level causes of tail-latency spikes.

Typer CLI. Commands raise typed errors (jitterscope.common.errors); only main() turns
them into one clear line and an exit code.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from jitterscope.common import errors, settings as settings_mod

app = typer.Typer(
    help="Find the kernel-level causes of tail-latency spikes in GPU inference fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="TOML config file (env: JITTERSCOPE_CONFIG)")]
BootstrapOpt = Annotated[Optional[str], typer.Option(
    "--bootstrap-servers", help="Kafka to use instead of the embedded broker (env: JITTERSCOPE_BOOTSTRAP_SERVERS)")]
ClickHouseOpt = Annotated[Optional[str], typer.Option(
    "--clickhouse-url", help="ClickHouse server URL instead of embedded chDB (env: JITTERSCOPE_CLICKHOUSE_URL)")]
DataDirOpt = Annotated[Optional[Path], typer.Option(
    "--data-dir", help="embedded ClickHouse and state (env: JITTERSCOPE_DATA_DIR)")]
HostOpt = Annotated[Optional[str], typer.Option("--host", help="host name records carry (default: hostname)")]
PidOpt = Annotated[Optional[list[int]], typer.Option("--pid", help="watch this process (repeatable; default: all)")]
CommOpt = Annotated[Optional[list[str]], typer.Option(
    "--comm", help="watch processes whose name matches this shell pattern (repeatable)")]
ThresholdOpt = Annotated[Optional[float], typer.Option(
    "--threshold-ms", help="run-queue waits at or above this leave the kernel as events (default 5)")]
AlertOpt = Annotated[Optional[float], typer.Option(
    "--alert-ms", help="run-queue wait that raises an alert (default 10)")]


SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="any setting as NAME=VALUE (lists/maps as JSON), e.g. --set request_slo_ms=250 (repeatable)")]


def _settings(config: Path | None, sets: list[str] | None = None, **flags):
    """Settings from flags (named ones and --set NAME=VALUE), env and file."""
    import json

    for item in sets or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise errors.BadConfig(f"--set {item!r} is not NAME=VALUE")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value  # a plain string
        key = name.strip().replace("-", "_")
        if flags.get(key) in (None, []):  # a named flag, when given, wins
            flags[key] = parsed
    return settings_mod.load(config, **flags)


@app.command()
def up(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
    host: HostOpt = None,
    pid: PidOpt = None,
    comm: CommOpt = None,
    threshold_ms: ThresholdOpt = None,
    alert_ms: AlertOpt = None,
    broker_port: Annotated[Optional[int], typer.Option(help="embedded broker port (0 = any free port)")] = None,
    duration: Annotated[Optional[float], typer.Option(help="stop by itself after this many seconds")] = None,
) -> None:
    """Watch this host: embedded broker, collector, streams worker and ClickHouse; print alerts as they happen."""
    from jitterscope.up import Stack

    s = _settings(config, sets, bootstrap_servers=bootstrap_servers, clickhouse_url=clickhouse_url, data_dir=data_dir,
                  host=host, target_pids=pid, target_comms=comm, runq_threshold_ms=threshold_ms,
                  runq_alert_ms=alert_ms, broker_port=broker_port)
    Stack(s, console).run(duration)


@app.command()
def collector(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    host: HostOpt = None,
    pid: PidOpt = None,
    comm: CommOpt = None,
    threshold_ms: ThresholdOpt = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="Prometheus /metrics port (0 = off)")] = None,
    duration: Annotated[Optional[float], typer.Option(help="stop by itself after this many seconds")] = None,
) -> None:
    """Run this host's collector: load the probes and publish their records to Kafka (needs root)."""
    from jitterscope.common import logs
    from jitterscope.collector.agent import Collector, install_signal_handlers
    from jitterscope.collector.probes.base import require_loadable

    s = _settings(config, sets, bootstrap_servers=bootstrap_servers, host=host, target_pids=pid, target_comms=comm,
                  runq_threshold_ms=threshold_ms, collector_metrics_port=metrics_port)
    _require_broker(s)
    require_loadable()  # not root, no tracefs, ...: say so first, not after a wait for Kafka
    _require_topics(s, duration)
    logs.setup()
    agent = Collector(s)
    install_signal_handlers(agent)
    agent.run(duration)


@app.command()
def streams(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
    alert_ms: AlertOpt = None,
    web_port: Annotated[Optional[int], typer.Option(help="port for /metrics and /query (0 = off)")] = None,
) -> None:
    """Run a streams worker: decode, alert, and write everything to ClickHouse."""
    from jitterscope.common import logs
    from jitterscope.streams.app import StreamsWorker

    s = _settings(config, sets, bootstrap_servers=bootstrap_servers, clickhouse_url=clickhouse_url, data_dir=data_dir,
                  runq_alert_ms=alert_ms, streams_web_port=web_port)
    _require_broker(s)
    _require_topics(s)
    logs.setup()
    StreamsWorker(s, s.bootstrap_servers).run()


@app.command()
def broker(
    port: Annotated[int, typer.Option(help="port to listen on, 127.0.0.1 only")] = 29092,
) -> None:
    """Run the embedded Kafka-compatible broker (Tansu) with jitterscope's topics, until Ctrl-C."""
    import signal
    import threading

    from jitterscope.broker import EmbeddedBroker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port) as b:
        console.print(f"broker on {b.bootstrap_servers} (memory only); Ctrl-C stops it")
        try:
            while not stop.wait(0.5):
                if b.proc.poll() is not None:
                    raise errors.BrokerUnavailable(f"broker exited with status {b.proc.returncode}")
        except KeyboardInterrupt:
            pass


@app.command()
def query(
    sql: Annotated[Optional[str], typer.Argument(
        help="SQL to run (read-only), e.g. \"SELECT count() FROM jitterscope.runq_events\"")] = None,
    saved: Annotated[Optional[str], typer.Option("--saved", "-s", help="run a saved fleet query by name")] = None,
    list_saved: Annotated[bool, typer.Option("--list-saved", help="list the saved queries and their parameters")] = False,
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
    s = _settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
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


@app.command()
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
    s = _settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
    _print_rows(*run_query(s, sql, parameters), fmt)


@app.command()
def stacks(
    since: Annotated[str, typer.Option(help="period covered: 30m, 24h, 7d, ... (unless --start)")] = "24h",
    start: Annotated[Optional[str], typer.Option(help="from this moment (ISO 8601, UTC if no zone)")] = None,
    end: Annotated[Optional[str], typer.Option(help="until this moment (ISO 8601; default now)")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="only this host (default: every host)")] = None,
    victim: Annotated[bool, typer.Option(
        "--victim", help="the waiters' stacks when preempted, instead of the culprits' (who held the CPU)")] = False,
    limit: Annotated[int, typer.Option(help="stacks at most")] = 20,
    folded: Annotated[bool, typer.Option(
        "--folded", help="folded stacks for flame graphs ('frame;frame count', count = microseconds of wait)")] = False,
    alert: Annotated[Optional[int], typer.Option(
        "--alert", help="the stacks of one run-queue alert: its seq (with --host)")] = None,
    sets: SetOpt = None,
    config: ConfigOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """The code behind run-queue waits: top culprit stacks by the wait they caused, one alert's stacks, folded output."""
    from jitterscope import stacks as stacks_cmd
    from jitterscope.common.logs import printable
    from jitterscope.query import run_query

    s = _settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
    stacks_cmd.run(lambda sql, params: run_query(s, sql, {k: str(v) for k, v in params.items()})[1],
                   lambda line: print(printable(line)), since=since, start=start, end=end, host=host,
                   victim=victim, limit=limit, folded=folded, alert=alert)


@app.command()
def doctor(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Check everything the collector and the pipeline need, and say how to fix what is missing."""
    from rich.markup import escape

    from jitterscope.common.masking import mask_text
    from jitterscope.doctor import run_checks

    s = _settings(config, sets, bootstrap_servers=bootstrap_servers, clickhouse_url=clickhouse_url, data_dir=data_dir)
    failed = 0
    for check in run_checks(s):
        mark = "[green]ok[/]  " if check.ok else "[red]FAIL[/]"
        # details quote the ClickHouse URL and client errors: never its password, never markup
        console.print(f"{mark} {check.name:16} {escape(mask_text(str(check.detail)))}")
        if not check.ok:
            failed += 1
            console.print(f"     {'':16} fix: {escape(mask_text(str(check.fix)))}")
    if failed:
        raise typer.Exit(1)


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(help="how long to run")] = 20.0,
    cpu: Annotated[Optional[int], typer.Option(help="CPU to crowd (default: the last one)")] = None,
    hogs: Annotated[int, typer.Option(help="CPU hogs sharing the victim's CPU (0 = unloaded control)")] = 3,
) -> None:
    """Cause run-queue starvation on purpose: a bursty 'jsvictim' thread pinned with 'jshog' CPU hogs.

    Run it next to 'jitterscope up' to see alerts name jsvictim and a jshog."""
    from jitterscope.workload import HOG_COMM, VICTIM_COMM, last_cpu, starvation

    cpu = last_cpu() if cpu is None else cpu
    with starvation(seconds, cpu, hogs, delay=0) as victim:
        console.print(f"{VICTIM_COMM} (pid {victim.pid}) and {hogs} {HOG_COMM} share CPU {cpu} for {seconds:g}s")


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="where to write the HTML file")] = Path("jitterscope-report.html"),
    since: Annotated[str, typer.Option(help="period covered: 24h, 7d, ...")] = "7d",
    remediation_date: Annotated[Optional[str], typer.Option(
        help="compare before/after this moment: ISO 8601 (UTC if no zone), e.g. 2026-11-29T12:00, "
             "or a time before now, e.g. now-12h")] = None,
    sets: SetOpt = None,
    config: ConfigOpt = None,
    clickhouse_url: ClickHouseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Write the capacity-planning report: a self-contained HTML file with trends, causes, placement and actions."""
    from datetime import datetime, timedelta, timezone

    from jitterscope.query import run_query
    from jitterscope.reports import capacity, queries

    s = _settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
    _check_out_file(out)  # before minutes of building, not after
    remediation = None
    if remediation_date:
        try:
            if remediation_date.startswith("now-"):  # relative, as Grafana writes it
                ago = timedelta(seconds=queries.parse_duration(remediation_date[4:]))
                remediation = datetime.now(timezone.utc) - ago
            else:
                remediation = datetime.fromisoformat(remediation_date)
        except (ValueError, errors.BadConfig) as exc:
            raise errors.BadConfig(f"--remediation-date {remediation_date!r}: {exc}; "
                                   "use e.g. 2026-11-29T12:00 or now-12h") from exc
        if remediation.tzinfo is None:
            remediation = remediation.replace(tzinfo=timezone.utc)
    no_data: list[errors.NoData] = []

    def rows(sql: str, params: dict) -> list:
        try:
            return run_query(s, sql, {k: str(v) for k, v in params.items()})[1]
        except errors.NoData as exc:  # nothing collected yet: every section renders empty
            no_data[:1] = [exc]
            return []

    ctx = capacity.Context(rows, queries.parse_duration(since), remediation, s.runq_alert_ms)
    with console.status("building the report") as status:
        html = capacity.build(ctx, progress=lambda title: status.update(f"building: {title}"))
    from jitterscope.common.private import open_private

    try:  # it names hosts and processes: 0600, and never written through a symlink
        with os.fdopen(open_private(out), "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as exc:
        raise errors.BadConfig(f"cannot write --out {out}: {exc.strerror}") from exc
    console.print(f"wrote {out} ({len(html) / 1024:.0f} KiB)", soft_wrap=True)
    if no_data:
        err_console.print(f"note: the report is empty; {no_data[0]}", soft_wrap=True, markup=False)


def _check_out_file(out: Path) -> None:
    """--out must name a file in a folder that exists and this user may write, not a symlink."""
    if out.is_symlink():
        raise errors.BadConfig(f"--out {out} is a symbolic link, which the report is never written through: "
                               "remove it or choose another --out")
    if out.is_dir():
        raise errors.BadConfig(f"--out {out} is a directory: name a file, e.g. --out {out / 'report.html'}")
    folder = out.parent
    if not folder.is_dir():
        raise errors.BadConfig(f"--out {out}: folder {folder} does not exist (mkdir -p {folder})")
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise errors.BadConfig(f"--out {out}: this user may not write there; choose another --out")


@app.command()
def schema(
    cluster: Annotated[Optional[str], typer.Option(
        help="print the replicated + distributed variant for this cluster name ('{cluster}' macro if empty)")] = None,
) -> None:
    """Print jitterscope's ClickHouse DDL: the single-node migrations, or their cluster variant."""
    from jitterscope.streams import clickhouse

    if cluster is None:
        statements = [st for _v, _n, sql in clickhouse.migrations() for st in clickhouse.split_statements(sql)]
    else:
        statements = clickhouse.cluster_ddl(cluster or "{cluster}")
    print(";\n\n".join(statements) + ";")


@app.command()
def config(
    example: Annotated[bool, typer.Option(
        "--example", help="print every setting with its description and default (deploy/jitterscope.example.toml)")]
    = False,
    sets: SetOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Print the settings this command line resolves to, as TOML (secrets masked), or with --example every
    setting's description and default."""
    if example:
        print(settings_mod.example_toml(), end="")
        return
    from jitterscope.common.masking import masked_settings  # which settings are secret: common/masking.py

    s = _settings(config, sets)
    for name, value in masked_settings(s).items():
        print(f"{name} = {settings_mod.toml_value(value)}" if value is not None else f"# {name} is unset")


@app.command("synthetic-fleet")
def synthetic_fleet(
    hosts: Annotated[int, typer.Option(help="how many hosts")] = 300,
    events: Annotated[int, typer.Option(help="how many run-queue events (100M takes minutes and ~3 GB; "
                                              "loaded in steps of 5M)")] = 2_000_000,
    hours: Annotated[int, typer.Option(help="over how many past hours")] = 24,
    sets: SetOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Load a synthetic fleet with known root causes into the embedded store, to try saved queries and reports."""
    from rich.progress import Progress

    from jitterscope.reports import synthetic
    from jitterscope.streams import clickhouse

    s = _settings(config, sets, data_dir=data_dir)
    client = clickhouse.connect(None, s.data_dir)
    clickhouse.migrate(client)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("generating the fleet", total=None)  # the step count depends on --events
        synthetic.load_fleet(client, progress=lambda i, n: progress.update(task, completed=i, total=n),
                             hosts=hosts, runq_events=events, hours=hours)
    client.close()
    # the hints name the store just filled: without --data-dir they would read the default one
    where = "" if s.data_dir == settings_mod.default_data_dir() else f" --data-dir {shlex.quote(str(s.data_dir))}"
    console.print(f"loaded {hosts} hosts and {events:,} run-queue events into {s.data_dir}; try: "
                  f"jitterscope query --saved worst-hosts{where}  or  jitterscope report{where} --out report.html",
                  soft_wrap=True, markup=False)


@app.command()
def record(
    out: Annotated[Path, typer.Option(
        "--out", help="recording file to write (gzip, mode 0600; replaced if it exists; never a symlink)")],
    duration: Annotated[float, typer.Option(help="record for this many seconds (Ctrl-C stops earlier)")],
    sets: SetOpt = None,
    config: ConfigOpt = None,
    host: HostOpt = None,
    pid: PidOpt = None,
    comm: CommOpt = None,
    threshold_ms: ThresholdOpt = None,
) -> None:
    """Run this host's collector into a file instead of Kafka, to capture an incident on a host without a
    pipeline (needs root). The file holds the collector's Kafka messages with their keys; 'jitterscope replay'
    publishes them later."""
    from jitterscope.collector.agent import Collector, install_signal_handlers
    from jitterscope.collector.recording import RecordingPublisher
    from jitterscope.common import logs

    s = _settings(config, sets, host=host, target_pids=pid, target_comms=comm, runq_threshold_ms=threshold_ms,
                  collector_metrics_port=0)
    logs.setup()

    def progress(p) -> None:
        err_console.print(f"recording: {p.records_sent:,} records, {_size(p.bytes_written)}", highlight=False)

    publisher = RecordingPublisher(out, s.host, max_message_bytes=s.kafka_max_message_bytes,
                                   max_records=s.batch_max_records, progress=progress, progress_every_s=5.0)
    agent = Collector(s, publisher=publisher)
    install_signal_handlers(agent)
    agent.run(duration)
    per_topic = ", ".join(f"{t.removeprefix('jitterscope.')} {n:,}" for t, n in sorted(publisher.sent_by_topic.items()))
    console.print(f"recorded {publisher.records_sent:,} records ({per_topic or 'none'}) in {out}, "
                  f"{_size(out.stat().st_size)}", soft_wrap=True)
    if publisher.undelivered:
        raise errors.JitterscopeError(f"{publisher.undelivered} records could not be written: {publisher.last_error}")


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


@app.command()
def replay(
    file: Annotated[Path, typer.Argument(help="a recording made by 'jitterscope record'", exists=True, dir_okay=False)],
    bootstrap_servers: BootstrapOpt = None,
    create_topics: Annotated[bool, typer.Option(
        "--create-topics", help="create missing jitterscope topics first")] = False,
    host: Annotated[Optional[str], typer.Option(
        "--host", help="the host whose records to replay (required; the error names the hosts the file holds)")] = None,
    sets: SetOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Publish one host's records from a recording into a pipeline (real Kafka, or the broker of a running
    'jitterscope up'), keys kept: records keep their host, boot id and sequence, so replaying twice stores them
    once. Only jitterscope's input topics, and only records that carry --host, are published; other frames are
    refused and counted."""
    from jitterscope.collector.recording import check_host, replay as replay_file, summarize
    from jitterscope.common import kafka_auth

    summary = summarize(file)  # a damaged or hostile file is refused here, before anything else
    check_host(summary, host, file)
    s = _settings(config, sets, bootstrap_servers=bootstrap_servers)
    if not s.bootstrap_servers:
        raise errors.BadConfig(
            "replay needs a broker: pass --bootstrap-servers HOST:PORT (or set JITTERSCOPE_BOOTSTRAP_SERVERS); "
            "for a local pipeline, start 'jitterscope up' and use the broker address it prints")
    if summary.truncated:
        from rich.markup import escape

        err_console.print(f"[yellow]note:[/] {escape(str(file))} is truncated ({escape(summary.error)}); replaying "
                          f"its {summary.records:,} complete records", soft_wrap=True)
    if create_topics:
        from jitterscope.topics import create

        create(s)
    result = replay_file(file, s.bootstrap_servers, host=host, extra_config=kafka_auth.librdkafka_config(s),
                         progress=lambda r: err_console.print(f"replaying: {r.records:,} of {summary.records:,} records"))
    per_topic = ", ".join(f"{t.removeprefix('jitterscope.')} {n:,}" for t, n in sorted(result.by_topic.items()))
    console.print(f"replayed {result.records:,} records of host {host} ({per_topic or 'none'}) in "
                  f"{result.messages:,} messages from {file} to {s.bootstrap_servers}", soft_wrap=True, markup=False)
    if result.refused:
        for why, frames in sorted(result.refused.items()):
            err_console.print(f"refused {frames:,} frame(s): {why}", soft_wrap=True, markup=False)
        raise errors.JitterscopeError(
            f"{sum(result.refused.values()):,} frame(s) ({result.refused_records:,} records) of {file} were refused "
            "and not published (see above)")


topics_app = typer.Typer(help="Create or check jitterscope's Kafka topics (kafka_partitions, kafka_replication_factor).",
                         no_args_is_help=True)
app.add_typer(topics_app, name="topics")


PartitionsOpt = Annotated[Optional[int], typer.Option(help="partitions per topic (kafka_partitions, default 4)")]
ReplicationOpt = Annotated[Optional[int], typer.Option(help="replicas per topic (kafka_replication_factor, default 1)")]


@topics_app.command("create")
def topics_create(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    partitions: PartitionsOpt = None,
    replication_factor: ReplicationOpt = None,
) -> None:
    """Create every missing jitterscope topic, then check them all."""
    from jitterscope import topics

    s = _settings(config, sets, bootstrap_servers=bootstrap_servers, kafka_partitions=partitions,
                  kafka_replication_factor=replication_factor)
    _require_broker(s)
    created = topics.create(s)
    console.print(f"created {len(created)} topic(s) on {s.bootstrap_servers}" + (f": {', '.join(created)}" if created else ""),
                  soft_wrap=True)
    _topics_report(s)


@topics_app.command("check")
def topics_check(
    sets: SetOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    partitions: PartitionsOpt = None,
    replication_factor: ReplicationOpt = None,
) -> None:
    """Check every jitterscope topic exists with the configured partitions and replication factor (exit 1 if not)."""
    s = _settings(config, sets, bootstrap_servers=bootstrap_servers, kafka_partitions=partitions,
                  kafka_replication_factor=replication_factor)
    _require_broker(s)
    _topics_report(s)


def _topics_report(s) -> None:
    from jitterscope import topics

    states = topics.describe(s)
    bad = topics.problems(s, states)
    for t in states:
        mark = "[red]FAIL[/]" if t.name in bad else "[green]ok[/]  "
        detail = bad.get(t.name) or f"{t.partitions} partitions, replication factor {t.replication_factor}"
        console.print(f"{mark} {t.name:32} {detail}")
    if bad:
        raise errors.BadConfig(f"{len(bad)} of {len(states)} topics are not as configured; "
                               f"jitterscope topics create --bootstrap-servers {s.bootstrap_servers} makes missing ones")


def _require_topics(s, duration_s: float | None = None) -> None:
    from jitterscope import topics

    # a --duration bounds the wait for an unreachable broker too (at least 1 s to hear back)
    topics.require(s, timeout_s=15.0 if duration_s is None else min(15.0, max(duration_s, 1.0)))


def _require_broker(s) -> None:
    if not s.bootstrap_servers:
        raise errors.BadConfig(
            "no Kafka given: pass --bootstrap-servers (or JITTERSCOPE_BOOTSTRAP_SERVERS), "
            "or run 'jitterscope up', which starts the embedded broker")


def main() -> None:
    try:
        app()
    except errors.JitterscopeError as exc:
        # one line, however long: scripts grep it and terminals wrap it themselves
        from rich.markup import escape  # messages quote user input: never markup

        from jitterscope.common.masking import mask_text  # errors mask themselves; this is the last guard

        err_console.print(f"[red]jitterscope:[/] {escape(mask_text(str(exc)))}", soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
