# SPDX-License-Identifier: Apache-2.0
"""What the CLI's command modules share: the consoles, the options several
commands take, and the settings they resolve to.

Commands raise typed errors (jitterscope.common.errors); only cli.main()
turns them into one clear line and an exit code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from jitterscope.common import errors, settings as settings_mod

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


def load_settings(config: Path | None, sets: list[str] | None = None, **flags):
    """Settings from flags (named ones and --set NAME=VALUE), env and file."""
    # a named list flag not given is [] (Typer's default), not "make it empty"; a --set
    # value is always given, [] included (--set hardware_probes='[]': no hardware probes)
    given = {k: v for k, v in flags.items() if v is not None and v != []}
    for item in sets or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise errors.BadConfig(f"--set {item!r} is not NAME=VALUE")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value  # a plain string
        given.setdefault(name.strip().replace("-", "_"), parsed)  # a named flag, when given, wins
    return settings_mod.load(config, **given)


def require_broker(s) -> None:
    if not s.bootstrap_servers:
        raise errors.BadConfig(
            "no Kafka given: pass --bootstrap-servers (or JITTERSCOPE_BOOTSTRAP_SERVERS), "
            "or run 'jitterscope up', which starts the embedded broker")


def require_topics(s, duration_s: float | None = None) -> None:
    from jitterscope import topic_admin as topics

    # a --duration bounds the wait for an unreachable broker too (at least 1 s to hear back)
    topics.require(s, timeout_s=15.0 if duration_s is None else min(15.0, max(duration_s, 1.0)))
