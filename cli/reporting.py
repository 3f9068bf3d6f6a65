# SPDX-License-Identifier: Apache-2.0
"""`jitterscope report`: the capacity-planning report, one self-contained
HTML file (reports/capacity.py builds it; this checks --out and writes it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from jitterscope.common import errors
from jitterscope.options import ClickHouseOpt, ConfigOpt, DataDirOpt, SetOpt, console, err_console, load_settings


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
    """Write the capacity-planning report: a self-contained HTML file that opens with its summary (worst hosts, top
    causes, three actions), then trends, causes, placement and every action."""
    from datetime import datetime, timedelta, timezone

    from jitterscope.query import run_query
    from jitterscope.reports import capacity, queries

    s = load_settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir)
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

    ctx = capacity.Context(rows, queries.parse_duration(since), remediation, s.runq_alert_ms, since_text=since,
                           self_cost_target=s.self_cost_target_pct / 100)
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
