# SPDX-License-Identifier: Apache-2.0
"""`jitterscope fix`: the plan (reports/fix_plan.py), its changes made and
taken back (fix_journal.py), and their effect verified (reports/fix_verify.py).
See docs/fix.md."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from jitterscope.common import errors
from jitterscope.options import ClickHouseOpt, ConfigOpt, DataDirOpt, SetOpt, load_settings


def fix(
    keys: Annotated[Optional[list[str]], typer.Argument(
        help="with --apply or --diff: the plan's actions to take, by key (e.g. move:jshog:4242)")] = None,
    apply: Annotated[bool, typer.Option("--apply", help="make the named actions' changes (journaled first)")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="print what --apply would change, and change nothing")] = False,
    undo: Annotated[bool, typer.Option("--undo", help="take back every change --apply made, newest first")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="request latency before (--since) and after the changes "
                                                          "in effect, with a 95% interval")] = False,
    since: Annotated[str, typer.Option(help="period whose attributed requests the plan answers: 30m, 24h...")] = "30m",
    host: Annotated[Optional[str], typer.Option(
        "--host", help="the host the plan is for (default: this host's name, as its collector names it)")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json")] = "text",
    confine_mb: Annotated[int, typer.Option(
        "--confine-mb", min=16, help="the memory limit of the cgroup a confine: action gives an evictor (MiB)")] = 256,
    sets: SetOpt = None, config: ConfigOpt = None, clickhouse_url: ClickHouseOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """A plan to fix this host's tail latency: ranked changes, each with its computed gain and its undo.

    Each action merges the requests it answers and says what it changes, what it takes off the serving group's P99/P999 (from request_attribution), and how to undo it.

    --apply KEY... makes the named changes, each journaled first in the data dir; --undo takes them back. Run it on the host itself. See docs/fix.md."""  # noqa: E501 (--help shows its line breaks)
    import dataclasses

    from jitterscope.fix_journal import Journal, memory_home, read_limit
    from jitterscope.query import run_query
    from jitterscope.reports import fix_plan, queries
    from jitterscope.schemas.topology import parse_cpu_list

    if fmt not in ("text", "json"):
        raise errors.BadConfig(f"--format {fmt!r}: use text or json")
    if (apply or diff) != bool(keys) or (undo or verify) and (apply or diff or keys) or (undo and verify):
        raise errors.BadConfig("--apply and --diff take the plan's action keys (jitterscope fix --apply KEY...); "
                               "--undo and --verify take none, and go alone; the plan alone takes neither")
    s = load_settings(config, sets, clickhouse_url=clickhouse_url, data_dir=data_dir, host=host)
    if undo:
        for line in Journal(s.data_dir).undo():
            print(line)
        return
    if verify:
        _verify(s, Journal(s.data_dir), queries.parse_duration(since))
        return
    params = {"host": s.host, "since": str(queries.parse_duration(since))}
    requests = fix_plan.requests_of(run_query(s, fix_plan.REQUESTS_SQL, params)[1])
    processes = fix_plan.processes_of(run_query(s, fix_plan.PROCESSES_SQL, params)[1])
    host_cpus = parse_cpu_list(open("/sys/devices/system/cpu/online").read())
    actions, not_offered = fix_plan.plan(requests, processes, host_cpus, fix_plan.read_live, _describe, read_limit,
                                         memory_home, confine_mb << 20)
    if keys:
        for line in Journal(s.data_dir).apply(actions, keys, diff=diff):
            print(line)
        return
    if fmt == "json":
        print(json.dumps({"host": s.host, "since": since, "requests": len(requests), "not_offered": not_offered,
                          "actions": [{**{k: v for k, v in dataclasses.asdict(a).items() if k != "removed"},
                                       "command": a.command, "undo": a.undo} for a in actions]}, indent=2))
        return
    from jitterscope.common.logs import printable

    for line in fix_plan.format_plan(actions, not_offered, s.host, since, len(requests)):
        print(printable(line))


def _verify(s, journal, since_s: int) -> None:
    """`fix --verify`: the serving group's latency before and after the changes in effect."""
    import random
    from datetime import datetime

    from jitterscope.query import run_query
    from jitterscope.reports import fix_verify

    changes = journal.in_effect()
    if not changes:
        raise errors.BadConfig("no change in effect to verify: apply one first (jitterscope fix --apply KEY)")
    applied_ns = max(c.applied_ns for c in changes)
    rows = run_query(s, fix_verify.SQL, {"host": s.host, "applied": str(applied_ns),
                                         "from_ns": str(applied_ns - since_s * 1_000_000_000)})[1]
    found, shares = fix_verify.verdicts(rows, random.Random(0))  # seeded: the same store gives the same interval
    when = datetime.fromtimestamp(applied_ns / 1e9).strftime("%H:%M:%S") + " (" + ", ".join(
        sorted({c.key for c in changes})) + ")"
    for line in fix_verify.format_verdicts(found, shares, when):
        print(line)


def _describe(pid: int):
    """A process as this host describes it now (its record not stored yet); None when it has exited."""
    from jitterscope.collector import hostinfo
    from jitterscope.reports.fix_plan import Process

    try:
        info = hostinfo.process_info(pid)
    except (hostinfo.ProcessGone, OSError):
        return None
    return Process(info["pid"], info["comm"], tuple(info["cpus_allowed"]), 0, info["container_id"])
