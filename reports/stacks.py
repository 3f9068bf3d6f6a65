# SPDX-License-Identifier: Apache-2.0
"""The stacks behind run-queue waits: which code held the CPUs the waiters
wanted (culprit = the suspect's stack), and where the waiters were when they
were preempted (the victim's stack).

Stack ids are hashes of the symbolized frames (collector/stacks.py), the
same on every host, so waits add up across the fleet. Used by
`jitterscope stacks` and by the capacity report's "Top culprit stacks".
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Callable

from jitterscope.schemas.signals import DATABASE as DB

ROLES = {"suspect": "suspect_stack", "victim": "victim_stack"}  # role -> runq_events column

Query = Callable[[str, dict], list]  # (sql, parameters) -> rows


@dataclass(frozen=True)
class Stack:
    stack_id: int
    comm: str
    kernel: list[str]   # innermost frame first
    user: list[str]
    waits: int = 0      # run-queue events naming it
    wait_ns: int = 0    # their total wait
    hosts: int = 0

    def innermost_first(self) -> list[tuple[str, bool]]:
        """(frame, is_kernel), innermost first: the kernel frames, then the
        user frames that called into the kernel. The one order in which
        `jitterscope stacks` and the report list a stack."""
        return [(f, True) for f in self.kernel] + [(f, False) for f in self.user]

    def frames(self) -> list[str]:
        """Root first, as a flame graph stacks them: the process, its user
        frames, then the kernel frames (marked ``_[k]``, as Brendan Gregg's
        stackcollapse tools do)."""
        return [self.comm, *reversed(self.user), *(f"{f}_[k]" for f in reversed(self.kernel))]


_STACKS = f"""(SELECT stack_id, any(comm) AS comm, any(kernel) AS kernel, any(user) AS user
               FROM {DB}.stacks GROUP BY stack_id)"""


def top(query: Query, start_ns: int, end_ns: int, host: str = "", role: str = "suspect",
        limit: int = 20, own: bool = False) -> list[Stack]:
    """The stacks of ``role`` ("suspect": the culprits; "victim") behind the
    most run-queue waiting in [start_ns, end_ns), on ``host`` or everywhere.
    Culprits that are jitterscope's own processes (``suspect_own``: known
    by pid, never by name) only with ``own``: on a host that runs the whole
    `up` they can outrank the neighbours a user is looking for, and their
    cost is the cost of watching (`doctor`, the report), not a neighbour."""
    column = ROLES[role]  # from the fixed table above, never from the user
    skip_own = role == "suspect" and not own
    rows = query(f"""
        SELECT e.stack_id, s.comm, s.kernel, s.user, e.waits, e.wait_ns, e.hosts FROM (
            SELECT {column} AS stack_id, count() AS waits, sum(wait_ns) AS wait_ns, uniqExact(host) AS hosts
            FROM {DB}.runq_events FINAL
            WHERE ts >= fromUnixTimestamp64Nano({{start_ns:Int64}}) AND ts < fromUnixTimestamp64Nano({{end_ns:Int64}})
              AND {column} != 0 AND ({{host:String}} = '' OR host = {{host:String}})
              AND NOT ({{skip_own:Bool}} AND suspect_own)
            GROUP BY stack_id) AS e
        INNER JOIN {_STACKS} AS s ON s.stack_id = e.stack_id
        ORDER BY e.wait_ns DESC, e.stack_id LIMIT {{limit:UInt32}}""",
        {"start_ns": start_ns, "end_ns": end_ns, "host": host, "limit": limit, "skip_own": skip_own})
    return [Stack(int(r[0]), r[1], list(r[2]), list(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in rows]


def of_alert(query: Query, host: str, seq: int) -> tuple[list, dict[str, Stack | None]]:
    """One run-queue alert (host, seq: as stored in ``alerts``): its row
    (ts, comm, pid, suspect_comm, suspect_pid, wait_ns) and its stacks by role
    (None where none was captured or it is not stored)."""
    rows = query(f"""
        SELECT ts, comm, pid, suspect_comm, suspect_pid, wait_ns, victim_stack, suspect_stack
        FROM {DB}.alerts FINAL WHERE host = {{host:String}} AND seq = {{seq:UInt64}} AND kind = 'runq_starvation'
        ORDER BY ts DESC LIMIT 1""", {"host": host, "seq": seq})
    if not rows:
        return [], {}
    alert = rows[0]
    ids = {"victim": int(alert[6]), "suspect": int(alert[7])}
    found = {int(r[0]): Stack(int(r[0]), r[1], list(r[2]), list(r[3])) for r in query(
        f"SELECT stack_id, comm, kernel, user FROM {_STACKS} WHERE stack_id IN ({{victim:UInt64}}, {{suspect:UInt64}})",
        ids)}
    return alert[:6], {role: found.get(i) for role, i in ids.items()}


#: Every character str.splitlines() breaks a line at (\n \r \v \f, the
#: file/group/record separators \x1c-\x1e, NEL, and U+2028/U+2029 LINE and
#: PARAGRAPH SEPARATOR), shown as an escape: a frame or process name must not
#: turn one folded line into several (a forged stack for the flame graph).
_LINE_BREAKS = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
                for c in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


def _folded_frame(frame: str) -> str:
    # ';' separates frames and the last space the count: neither may appear inside one
    return frame.translate(_LINE_BREAKS).replace(";", ":").replace(" ", "_")


def folded(stacks: list[Stack]) -> list[str]:
    """Folded stacks ("frame;frame;frame count"), weighted by the wait each
    caused in microseconds, for flamegraph.pl / speedscope / inferno."""
    return [";".join(map(_folded_frame, s.frames())) + f" {max(1, s.wait_ns // 1000)}" for s in stacks]


def section(ctx) -> str:
    """The capacity report's "Top culprit stacks": ``ctx`` is the report's
    Context (query, since_s). Every frame is escaped: names come from the
    watched programs."""
    import time

    end_ns = time.time_ns()
    stacks = top(ctx.query, end_ns - ctx.since_s * 1_000_000_000, end_ns, limit=10)
    if not stacks:
        return '<p class="empty">no culprit stacks captured in this period</p>'
    items = []
    for s in stacks:
        frames = "<br>".join(escape(f"{f} [kernel]" if kernel else f) for f, kernel in s.innermost_first()[:12])
        items.append(f"<tr><td>{escape(s.comm)}</td><td>{s.wait_ns / 1e9:,.2f}</td><td>{s.waits:,}</td>"
                     f"<td>{s.hosts:,}</td><td><code>{frames}</code></td></tr>")
    return ("<p>The code that held the CPUs inference threads waited for, ranked by the wait it caused. "
            "Each stack is listed as <code>jitterscope stacks</code> prints it: innermost frame first, the kernel "
            "frames (marked [kernel]) above the user frames that called into the kernel; "
            "<code>jitterscope stacks --folded</code> exports them root first for flame graphs.</p>"
            "<table><thead><tr><th>process</th><th>wait caused (s)</th><th>waits</th><th>hosts</th>"
            f"<th>stack, innermost frame first</th></tr></thead><tbody>{''.join(items)}</tbody></table>")
