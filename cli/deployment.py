# SPDX-License-Identifier: Apache-2.0
"""The commands that help set up a deployment: `doctor` (is everything the
collector and the pipeline need there), `schema` (the ClickHouse DDL) and
`config` (the settings a command line resolves to).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from jitterscope.common import settings as settings_mod
from jitterscope.options import BootstrapOpt, ClickHouseOpt, ConfigOpt, DataDirOpt, SetOpt, console, load_settings


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

    s = load_settings(config, sets, bootstrap_servers=bootstrap_servers, clickhouse_url=clickhouse_url,
                      data_dir=data_dir)
    failed = 0
    for check in run_checks(s):
        mark = "[red]FAIL[/]" if not check.ok else "[yellow]warn[/]" if check.warn else "[green]ok[/]  "
        # details quote the ClickHouse URL and client errors: never its password, never markup
        console.print(f"{mark} {check.name:16} {escape(mask_text(str(check.detail)))}")
        failed += not check.ok
        if not check.ok or check.warn:
            console.print(f"     {'':16} fix: {escape(mask_text(str(check.fix)))}")
    if failed:
        raise typer.Exit(1)


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

    s = load_settings(config, sets)
    for name, value in masked_settings(s).items():
        print(f"{name} = {settings_mod.toml_value(value)}" if value is not None else f"# {name} is unset")
