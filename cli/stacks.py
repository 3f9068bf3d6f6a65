# SPDX-License-Identifier: Apache-2.0
"""`jitterscope stacks`: the code behind run-queue waits, from the store.

    jitterscope stacks [--since 24h | --start ISO [--end ISO]] [--host H] [--victim] [--limit N]
    jitterscope stacks --folded > culprits.folded     # flamegraph.pl culprits.folded > culprits.svg
    jitterscope stacks --alert SEQ --host H           # one alert's victim and culprit stacks

The queries live in reports/stacks.py (the capacity report uses them too);
this module reads the options and prints.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable

from jitterscope.common import errors
from jitterscope.reports import queries
from jitterscope.reports import stacks as store


def _epoch_ns(text: str, option: str) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise errors.BadConfig(f"{option} {text!r}: {exc}; use ISO 8601, e.g. 2026-11-29T12:00") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1e9)


def time_range(since: str, start: str | None, end: str | None) -> tuple[int, int]:
    """[start, end) in epoch ns: --start/--end when given (UTC if no zone), else the last --since."""
    end_ns = _epoch_ns(end, "--end") if end else time.time_ns()
    start_ns = _epoch_ns(start, "--start") if start else end_ns - queries.parse_duration(since) * 1_000_000_000
    if start_ns >= end_ns:
        raise errors.BadConfig("--start must be before --end")
    return start_ns, end_ns


#: what a stack of each role is: taken at a context switch, it is where the
#: task was, not a profile of what it ran while it held the CPU
ROLE_MEANS = {"suspect": "where it gave up the CPU: a sleep there means it went to sleep, not that it slept "
                         "while holding it",
              "victim": "where it was preempted, as it became a waiter"}


def run(query: store.Query, out: Callable[[str], None], *, since: str = "24h", start: str | None = None,
        end: str | None = None, host: str | None = None, victim: bool = False, limit: int = 20,
        folded: bool = False, alert: int | None = None, own: bool = False) -> None:
    """Print what the options ask for through ``out`` (one call per line)."""
    if alert is not None:
        if not host:
            raise errors.BadConfig("--alert SEQ needs --host HOST (an alert is (host, seq), see the alerts table)")
        row, by_role = store.of_alert(query, host, alert)
        if not row:
            raise errors.BadConfig(f"no run-queue alert with seq {alert} on host {host!r}")
        ts, comm, pid, suspect_comm, suspect_pid, wait_ns = row
        out(f"{ts} {comm} (pid {pid}) waited {wait_ns / 1e6:.1f} ms, CPU held by {suspect_comm} (pid {suspect_pid})")
        for role in ("suspect", "victim"):
            stack = by_role.get(role)
            if folded:
                if stack:
                    out(store.folded([stack])[0])
                continue
            out(f"{role} stack ({ROLE_MEANS[role]}):" + ("" if stack else " none captured"))
            for line in _frames(stack) if stack else []:
                out(line)
        return
    if limit < 1:
        raise errors.BadConfig("--limit must be at least 1")
    start_ns, end_ns = time_range(since, start, end)
    found = store.top(query, start_ns, end_ns, host or "", "victim" if victim else "suspect", limit, own)
    if folded:
        for line in store.folded(found):
            out(line)
        return
    if not found:
        out("no stacks captured in this range (stacks are taken for waits over the probe threshold)")
    elif not victim:
        out(f"each culprit's stack {ROLE_MEANS['suspect']}")
    for rank, stack in enumerate(found, 1):
        out(f"#{rank} {stack.comm}: {stack.wait_ns / 1e6:,.1f} ms of waits caused over {stack.waits:,} "
            f"wait(s) on {stack.hosts} host(s)  [stack {stack.stack_id:016x}]")
        for line in _frames(stack):
            out(line)


def _frames(stack: store.Stack) -> list[str]:
    """Innermost first, kernel frames on top of the user ones they were called from (the report's order too)."""
    return [f"    {f}  [kernel]" if kernel else f"    {f}" for f, kernel in stack.innermost_first()]
