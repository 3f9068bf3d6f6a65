# SPDX-License-Identifier: Apache-2.0
"""`jitterscope fix --apply / --undo / --diff`: the plan's moves made, each
written first to a journal, and taken back in reverse order.

The journal (``fix-journal.jsonl`` in the data dir, mode 0600) holds one
line per change made: the action's key, the process (pid and start time:
a pid reused since is another process), what it found and what it set.
An undone change is marked, so applying and undoing are both idempotent.

Two kinds of change are applied: moves (every thread of the neighbour
gets the CPUs the plan named, as `taskset -apc` does) and file writes (a
throttled cgroup's CPU limit lifted: the file gets the plan's text, and its
text before is kept for the undo). An action not in the plan given, a piece
of advice, a process whose identity changed since the plan, or a file whose
text is no longer what the plan read is refused with why.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from jitterscope.common import errors
from jitterscope.common.private import open_private, private_dir
from jitterscope.reports.fix_plan import Action, Limit, Live, MemoryHome, read_live
from jitterscope.schemas.topology import cpu_list

JOURNAL = "fix-journal.jsonl"


@dataclass
class Change:
    """One move or one file write, as the journal keeps it."""

    key: str
    pid: int  # 0 for a file write
    start_ticks: int
    before: list[int]  # the CPUs it had
    after: list[int]  # the CPUs it was given
    applied_ns: int
    undone_ns: int = 0
    path: str = ""  # a file write: the file, its text before and the text written
    before_text: str = ""
    after_text: str = ""
    made_dir: str = ""  # a cgroup made (its undo removes it)
    procs_from: str = ""  # a process moved to another cgroup: the cgroup.procs it left and the one it joined
    procs_to: str = ""


def read_limit(cgroup: str) -> Limit | None:
    """A cgroup's CPU limit on this host now (the plan's ``limit_of``): None when it has none, or is gone."""
    from jitterscope.collector.probes.throttle import cpu_cgroup, read_stat

    group = cpu_cgroup(f"1:cpu:{cgroup}\n0::{cgroup}")
    stat = read_stat(group) if group else None
    if group is None or stat is None or stat.quota_us < 0:
        return None
    file = group.dir / ("cpu.max" if group.v2 else "cpu.cfs_quota_us")
    return Limit(str(file), _read(file), "max" if group.v2 else "-1")


def memory_home(pid: int) -> MemoryHome | None:
    """Where process ``pid``'s memory is charged now (the plan's ``memory_of``): None without a memory controller."""
    from jitterscope.collector.probes.throttle import controller_cgroup

    group = controller_cgroup(_read(f"/proc/{pid}/cgroup"), "memory")
    if group is None:
        return None
    depth = len([part for part in group.path.split("/") if part])  # the controller's root is that many up
    root = group.dir.parents[depth - 1] if depth else group.dir
    anon = next((int(line.split()[1]) << 10 for line in _read(f"/proc/{pid}/status").splitlines()
                 if line.startswith("RssAnon:")), 0)
    return MemoryHome(str(group.dir / "cgroup.procs"), str(root), group.v2, anon)


def _read(path: str | Path) -> str:
    from jitterscope.collector.probes.throttle import read_or_empty

    return read_or_empty(Path(path)).strip()


def _live_as_planned(key: str, pid: int, start_ticks: int) -> Live:
    """Process ``pid`` as it is now, refused unless it is the one the plan named (same start time)."""
    now = read_live(pid)
    if now is None or now.start_ticks != start_ticks:
        raise errors.BadConfig(f"{key!r}: pid {pid} is not the process the plan named (it exited or its pid "
                               "was reused); make the plan again")
    return now


def _threads(pid: int, proc: Path = Path("/proc")) -> list[int]:
    try:
        return [int(t) for t in os.listdir(proc / str(pid) / "task")]
    except OSError:
        return []


def _set_cpus(pid: int, cpus: list[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (a thread that ended meanwhile is skipped)."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue


class Journal:
    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / JOURNAL

    def changes(self) -> list[Change]:
        if not self.path.exists():
            return []
        return [Change(**json.loads(line)) for line in self.path.read_text().splitlines() if line.strip()]

    def in_effect(self) -> list[Change]:
        """The changes made and not undone: what --verify judges."""
        return [c for c in self.changes() if not c.undone_ns]

    def _write(self, changes: list[Change]) -> None:
        private_dir(self.path.parent)
        with os.fdopen(open_private(self.path), "w") as f:
            f.writelines(json.dumps(c.__dict__) + "\n" for c in changes)

    def apply(self, actions: list[Action], keys: list[str], diff: bool = False) -> list[str]:
        """Apply the plan's actions named by ``keys`` (lines saying what was
        done); with ``diff``, only say what would be. Refuses, before any
        change, a key not in the plan, advice and a process that changed."""
        by_key = {a.key: a for a in actions}
        writes: list[tuple[Action, str]] = []  # (action, file)
        moves: list[tuple[Action, int, Live]] = []  # (action, pid, the process as it is now)
        confines: list[Action] = []  # evictors given a memory cgroup of their own
        for key in keys:
            action = by_key.get(key)
            if action is None:
                raise errors.BadConfig(f"{key!r} is not in this plan (run `jitterscope fix` for its keys)")
            if not action.moves and not action.writes and not action.confine:
                raise errors.BadConfig(f"{key!r} is advice: jitterscope makes no change for it")
            for pid, (start_ticks, _procs) in sorted(action.confine.moves.items() if action.confine else ()):
                _live_as_planned(key, pid, start_ticks)
            if action.confine:
                confines.append(action)
            for path, (planned, after) in sorted(action.writes.items()):
                if _read(path) not in (planned, after):
                    raise errors.BadConfig(f"{key!r}: {path} is no longer {planned!r} as the plan read it; "
                                           "make the plan again")
                writes.append((action, path))
            for pid, (start_ticks, _cpus) in sorted(action.moves.items()):
                moves.append((action, pid, _live_as_planned(key, pid, start_ticks)))
        changes, lines = self.changes(), []
        for action, path in writes:
            lines += self._write_file(action.key, path, action.writes[path][1], changes, diff)
        for action, pid, now in moves:
            lines += self._move(action, pid, now, changes, diff)
        for action in confines:
            lines += self._confine(action, changes, diff)
        return lines

    def _confine(self, action: Action, changes: list[Change], diff: bool) -> list[str]:
        """Make the evictor's memory cgroup (if it is not there), set its limit, move its processes in."""
        c, lines = action.confine, []
        if not Path(c.dir).is_dir():
            if diff:
                lines.append(f"would make {c.dir}")
            else:
                changes.append(Change(action.key, 0, 0, [], [], time.time_ns(), made_dir=c.dir))
                self._write(changes)  # written before the change: a crash in between still leaves its undo
                os.mkdir(c.dir)
                lines.append(f"made {c.dir}")
        for path, text in c.writes.items():
            lines += self._write_file(action.key, path, text, changes, diff)
        joined = f"{c.dir}/cgroup.procs"
        for pid, (start_ticks, left) in sorted(c.moves.items()):
            if Path(joined).exists() and str(pid) in _read(joined).split():
                lines.append(f"{action.key}: pid {pid} is in {c.dir} already; nothing to do")
                continue
            line = f"{action.key}: pid {pid} memory cgroup {left.rsplit('/', 1)[0]} -> {c.dir}"
            if diff:
                lines.append("would move " + line)
                continue
            changes.append(Change(action.key, pid, start_ticks, [], [], time.time_ns(), procs_from=left,
                                  procs_to=joined))
            self._write(changes)
            Path(joined).write_text(str(pid))
            lines.append("moved " + line)
        return lines

    def _move(self, action: Action, pid: int, now: Live, changes: list[Change], diff: bool) -> list[str]:
        after = sorted(action.to_cpus)
        if sorted(now.cpus_allowed) == after:
            return [f"{action.key}: pid {pid} already on CPUs {cpu_list(after)}; nothing to do"]
        line = f"{action.key}: pid {pid} CPUs {cpu_list(sorted(now.cpus_allowed))} -> {cpu_list(after)}"
        if diff:
            return ["would set " + line]
        changes.append(Change(action.key, pid, now.start_ticks, sorted(now.cpus_allowed), after, time.time_ns()))
        self._write(changes)  # written before the change: a crash in between still leaves its undo
        _set_cpus(pid, after)
        return ["set " + line]

    def _write_file(self, key: str, path: str, after: str, changes: list[Change], diff: bool) -> list[str]:
        before = _read(path)
        if before == after:
            return [f"{key}: {path} is {after!r} already; nothing to do"]
        line = f"{key}: {path} {before!r} -> {after!r}"
        if diff:
            return ["would set " + line]
        changes.append(Change(key, 0, 0, [], [], time.time_ns(), path=path, before_text=before, after_text=after))
        self._write(changes)  # written before the change: a crash in between still leaves its undo
        Path(path).write_text(after)
        return ["set " + line]

    def undo(self) -> list[str]:
        """Revert every change not undone yet, newest first (lines saying what was done)."""
        changes, lines = self.changes(), []
        for change in reversed(changes):
            if change.undone_ns:
                continue
            if change.made_dir or change.procs_to:
                lines.append(self._undo_cgroup(change))
                change.undone_ns = time.time_ns()
                self._write(changes)
                continue
            if change.path:
                if Path(change.path).exists():
                    Path(change.path).write_text(change.before_text)
                    lines.append(f"{change.key}: {change.path} back to {change.before_text!r}")
                else:
                    lines.append(f"{change.key}: cannot undo: {change.path} is gone (nothing left to restore)")
                change.undone_ns = time.time_ns()
                self._write(changes)
                continue
            now = read_live(change.pid)
            if now is None or now.start_ticks != change.start_ticks:
                lines.append(f"{change.key}: cannot undo: pid {change.pid} has exited (nothing left to restore)")
            else:
                _set_cpus(change.pid, change.before)
                lines.append(f"{change.key}: pid {change.pid} back on CPUs {cpu_list(change.before)}")
            change.undone_ns = time.time_ns()
            self._write(changes)
        return lines or ["nothing to undo"]

    @staticmethod
    def _undo_cgroup(change: Change) -> str:
        """Put a moved process back in the cgroup it left, or remove a cgroup made (once it is empty)."""
        if change.made_dir:
            try:
                os.rmdir(change.made_dir)
            except FileNotFoundError:
                return f"{change.key}: {change.made_dir} is gone already"
            except OSError as exc:  # a process the plan did not name joined it (a child of the evictor's)
                return f"{change.key}: cannot remove {change.made_dir} ({exc.strerror}): move what is in it out first"
            return f"{change.key}: removed {change.made_dir}"
        now = read_live(change.pid)
        if now is None or now.start_ticks != change.start_ticks:
            return f"{change.key}: cannot undo: pid {change.pid} has exited (nothing left to restore)"
        Path(change.procs_from).write_text(str(change.pid))
        return f"{change.key}: pid {change.pid} back in {change.procs_from.rsplit('/', 1)[0]}"
