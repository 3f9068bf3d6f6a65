# SPDX-License-Identifier: Apache-2.0
"""An alert as one console line (`jitterscope up` prints each as it arrives)."""

from __future__ import annotations

import time
from datetime import datetime

from jitterscope.common.logs import printable
from jitterscope.schemas import events


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def format_alert(alert: events.Alert, printed_ns: int | None = None) -> str:
    """One console line. A new alert starts with the time of its evidence;
    a group's re-announcement or resolution (streams/alert_groups.py) is not
    a new wait, so it starts with the time it is printed (``printed_ns``,
    default now): lines stay in order, and the group's first time follows
    its count. A run-queue alert with a stack captured ends with its seq,
    what `jitterscope stacks --alert` takes; no other prints a seq that
    would lead nowhere there."""
    when = _clock(alert.ts_ns)
    if alert.kind != "runq_starvation":
        line = f"{alert.host} [{alert.severity}] {alert.summary}"
    else:
        held = f"{alert.suspect_comm} (pid {alert.suspect_pid})" if alert.suspect_pid else "idle/kernel"
        line = (f"{alert.host} [{alert.severity}] {alert.comm} (pid {alert.pid}, tid {alert.tid}) "
                f"waited {alert.wait_ns / 1e6:.1f} ms for CPU {alert.cpu}, held by {held}")
    state, count = alert.evidence.get("state"), alert.evidence.get("group_count")
    first = int(alert.evidence.get("group_first_ns", 0) or 0)
    since = f", since {_clock(first)}" if first else ""
    now = _clock(time.time_ns() if printed_ns is None else printed_ns)
    if state == "resolved":
        line = (f"{now} {alert.host} [resolved] {alert.kind} of {alert.comm} (pid {alert.pid}): quiet now, "
                f"{count} alert(s){since}, worst {int(alert.evidence.get('group_worst_ns', 0)) / 1e6:.1f} ms")
    else:
        stacked = alert.kind == "runq_starvation" and (alert.victim_stack or alert.suspect_stack)
        seq = f" seq {alert.seq}" if stacked else ""
        line = f"{now} {line} ({count} so far{since}){seq}" if count and count != "1" else f"{when} {line}{seq}"
    return printable(line)  # names come from the watched processes: no terminal escapes
