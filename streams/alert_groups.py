# SPDX-License-Identifier: Apache-2.0
"""Alerts a person can live with: every rule of repeated findings, in one place.

A finding repeats in one of two ways, and each kind is handled one way here:

- **A standing condition sampled again and again** (a process on the wrong
  NUMA node, a migration storm, a CPU's IRQ share each interval, a cgroup
  throttled every period): each sample restates the same finding, so the
  same finding about the same key (``Cooldowns.fresh``'s ``key``: the
  process, the CPU and source, the cgroup) is raised once per its kind's
  ``QUIET_PERIOD_NS`` and the repeats are dropped before storage. The
  worker's handlers (streams/handlers.py) ask ``Cooldowns`` as they judge.
- **A finding per kernel event or request** (``GROUPED_KINDS``): every alert is
  stored (fleet SQL counts events) and grouped for people (``AlertGroups``).
  ``irq`` and ``cfs_throttling`` are both: their samples are cooled first,
  and what passes is grouped with the run-queue-like alerts of its suspect.

Grouping: run-queue-like alerts grouped per (host, victim process, kind,
suspect) over a window, and resolved when quiet.

The per-event rules (runq_starvation, cfs_throttling, irq) raise one alert per
kernel event; a starved engine raises hundreds a minute. A group's first
alert goes out at once; repeats within ``window`` are folded into the group
(count, worst wait, first/last seen) and the group is re-announced at most
once per window while it keeps firing; a group without a new alert for
``quiet`` is resolved by one more alert record.

Every alert is still returned for storage (the alerts table keeps one row per
event, so fleet SQL and reports keep counting events); each grouped alert says
in ``evidence["state"]`` whether it was announced (``firing``) or folded
(``folded``), or that nobody asked to hear of its victim (``quiet``,
``Audience``): what a person saw is ``state NOT IN ('folded', 'quiet')``; ``group_count``,
``group_worst_ns``, ``group_first_ns``, ``group_last_ns`` are the group's. The ``Alert`` record
keeps its shape (a shared contract): group data lives in ``evidence``, as text.

Other kinds pass ``AlertGroups`` untouched. Pure: no I/O; the caller passes
the clock (``now_ns``), so tests drive it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache

import msgspec

from jitterscope.schemas.events import Alert

#: the per-event kinds that are grouped; others pass through. A slow
#: request is one event too: `up` and the notifiers show one line per cause
#: and suspect of a process, with a count, not one per request of a storm.
GROUPED_KINDS = frozenset({"runq_starvation", "cfs_throttling", "irq", "request_slo"})

#: how long the same sampled finding about the same key stays quiet
QUIET_PERIOD_NS = {
    "numa_cpu_mismatch": 600_000_000_000,
    "numa_remote_memory": 300_000_000_000,
    "numa_node_filler": 60_000_000_000,
    "migration_storm": 60_000_000_000,
    "irq": 60_000_000_000,  # per (CPU, source): a storm lasts; one alert a minute says so
    "cfs_throttling": 60_000_000_000,  # per cgroup: a quota too small throttles every period
    "xid": 60_000_000_000,  # per (GPU, code): 13 comes in threes, 45 once per channel
    "gpu_throttle": 60_000_000_000,  # per GPU: a slowdown lasts many readings
}

FIRING, FOLDED, RESOLVED = "firing", "folded", "resolved"
#: an alert about a process nobody asked to hear about (``Audience``): stored, never grouped or announced
QUIET = "quiet"

#: A resolution's seq: its last alert's seq with bit 62 set. The alerts
#: table replaces rows with the same (host, kind, boot_id, seq); the last
#: alert's own row must survive next to the resolution, and collector
#: sequence numbers never reach 2**62, so this key is unique and, like every
#: alert key, the same when the same evidence is processed again. (Not bit
#: 63: the records' U64 stops at 2**63 - 1, what msgspec can bound.)
RESOLVED_SEQ_BIT = 1 << 62

_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def suspect_of(alert: Alert) -> str:
    """What the alert blames: the task that held the CPU, else the interrupt
    (irq) or the quota cgroup (cfs_throttling) its rule names in evidence."""
    return alert.suspect_comm or alert.evidence.get("source", "") or alert.evidence.get("cgroup", "")


def group_key(alert: Alert) -> tuple:
    # host-level findings (irq: pid 0) have no victim process: their CPU stands for it
    victim = (alert.pid, alert.comm) if alert.pid else ("cpu", alert.cpu)
    key = (alert.host, *victim, alert.kind, suspect_of(alert))
    cause = alert.evidence.get("cause")  # a slow request's: the same suspect may explain it two ways
    return (*key, cause) if cause else key


def group_id(key: tuple) -> str:
    """A short stable name for a group (same key, same id, across restarts)."""
    return hashlib.sha256(msgspec.json.encode(list(key))).hexdigest()[:16]


def announced(alert: Alert) -> bool:
    """Whether the alert goes to people (the alerts topic, notifications)."""
    return alert.evidence.get("state") not in (FOLDED, QUIET)


@dataclass(frozen=True)
class Audience:
    """Whose waits people hear about. On a host watched whole, most waits
    are CPU hogs waiting for each other, or a CLI starting up beside them: a
    first run's console was half such lines. Announced are the waits of the
    processes that matter: a serving group's (they send request spans), a
    GPU holder's, and those the settings name (``announce_comms``, which
    holds `jitterscope demo`'s victim, and the collector's ``target_comms``
    and ``target_pids``). Every other alert is still stored, marked
    ``quiet``: fleet SQL counts every wait."""

    comms: tuple[str, ...] = ()
    pids: frozenset[int] = frozenset()

    @classmethod
    def from_settings(cls, settings) -> "Audience":
        comms = [*getattr(settings, "announce_comms", ()), *getattr(settings, "target_comms", ())]
        return cls(tuple(dict.fromkeys(comms)), frozenset(getattr(settings, "target_pids", ())))

    def hears_of(self, process) -> bool:
        """Whether the waits of ``process`` (a ProcessInfo; None: unknown) are announced."""
        if process is None:
            return False
        return bool(getattr(process, "serving_group", 0) or getattr(process, "gpus", None)
                    or process.pid in self.pids or _named(self.comms, process.comm))


@lru_cache(maxsize=4096)  # a storm's alert-worthy waits are the same few names over and over
def _named(patterns: tuple[str, ...], comm: str) -> bool:
    return any(fnmatchcase(comm, p) for p in patterns)


def quieted(alert: Alert) -> Alert:
    """The alert, stored but never announced (``Audience``)."""
    return msgspec.structs.replace(alert, evidence={**alert.evidence, "state": QUIET})


class Cooldowns:
    """Which sampled findings are new: the first of a (kind, host, key) in
    its kind's quiet period (``periods``: kind -> ns; a kind not in it is
    always new)."""

    def __init__(self, periods: dict[str, int] | None = None):
        self.periods = QUIET_PERIOD_NS if periods is None else periods
        self._raised: dict[tuple, int] = {}  # (kind, host, *key) -> when last raised

    def fresh(self, alert: Alert | None, *key) -> bool:
        """False for no finding, or one already raised within its quiet period."""
        if alert is None:
            return False
        quiet = self.periods.get(alert.kind, 0)
        ident = (alert.kind, alert.host, *key)
        if quiet and alert.raised_ns - self._raised.get(ident, -quiet) < quiet:
            return False
        self._raised[ident] = alert.raised_ns
        return True


@dataclass
class Group:
    key: tuple
    first_seen_ns: int  # clock of the first alert
    last_seen_ns: int
    latest: Alert
    worst: Alert
    severity: str  # the first alert's: a notification's labels must not change within a group
    count: int = 1
    announced_ns: int = 0
    unannounced: int = 0  # alerts folded since the last announcement
    id: str = field(default="")


class AlertGroups:
    """``window_ns``: re-announce a firing group at most this often;
    ``quiet_ns``: resolve a group after this long without a new alert;
    ``max_groups``: open groups at most (beyond it the one quiet longest is
    resolved early, so memory stays bounded and nothing goes unannounced)."""

    def __init__(self, window_ns: int, quiet_ns: int, max_groups: int = 10_000,
                 kinds: frozenset[str] = GROUPED_KINDS):
        if window_ns <= 0 or quiet_ns <= 0 or max_groups < 1:
            raise ValueError("window_ns, quiet_ns and max_groups must be positive")
        self.window_ns = window_ns
        self.quiet_ns = quiet_ns
        self.max_groups = max_groups
        self.kinds = kinds
        self.groups: dict[tuple, Group] = {}  # insertion order = order of last alert (moved on update)
        self.folded = 0  # alerts folded into a group, all time
        self.evicted = 0  # groups resolved early to stay within max_groups

    @classmethod
    def from_settings(cls, settings) -> "AlertGroups":
        return cls(int(settings.alert_group_window_s * 1e9), int(settings.alert_group_quiet_s * 1e9),
                   settings.alert_groups_max)

    def offer(self, alerts: list[Alert], now_ns: int) -> list[Alert]:
        """Every alert, marked firing or folded where grouped (plus the
        resolutions of groups evicted to make room), in order."""
        out: list[Alert] = []
        for alert in alerts:
            if alert.kind not in self.kinds or alert.evidence.get("state") == QUIET:
                out.append(alert)
                continue
            key = group_key(alert)
            group = self.groups.pop(key, None)  # re-inserted last: the dict stays ordered by last alert
            if group is None:
                while len(self.groups) >= self.max_groups:
                    self.evicted += 1
                    out.append(self._resolve(self.groups.pop(next(iter(self.groups))), now_ns))
                group = Group(key, now_ns, now_ns, alert, alert, alert.severity, announced_ns=now_ns,
                              id=group_id(key))
                self.groups[key] = group
                out.append(self._mark(group, alert, FIRING))
                continue
            self.groups[key] = group
            group.count += 1
            group.last_seen_ns = now_ns
            group.latest = alert
            if alert.wait_ns > group.worst.wait_ns:
                group.worst = alert
            if now_ns - group.announced_ns >= self.window_ns:
                group.announced_ns, group.unannounced = now_ns, 0
                out.append(self._mark(group, alert, FIRING))
            else:
                group.unannounced += 1
                self.folded += 1
                out.append(self._mark(group, alert, FOLDED))
        return out

    def tick(self, now_ns: int) -> list[Alert]:
        """Resolutions of the groups quiet for ``quiet_ns``, and a
        re-announcement (the latest alert again, with the group's count) of
        those with folded alerts whose window is over."""
        out = []
        for key, group in list(self.groups.items()):
            if now_ns - group.last_seen_ns >= self.quiet_ns:
                del self.groups[key]
                out.append(self._resolve(group, now_ns))
            elif group.unannounced and now_ns - group.announced_ns >= self.window_ns:
                group.announced_ns, group.unannounced = now_ns, 0
                out.append(self._mark(group, group.latest, FIRING))
        return out

    def _evidence(self, group: Group, state: str) -> dict[str, str]:
        # "group_" names: the rules' own evidence keys (irq's "count") stay as they are
        return {"state": state, "group": group.id, "group_count": str(group.count),
                "group_worst_ns": str(group.worst.wait_ns), "group_first_ns": str(group.first_seen_ns),
                "group_last_ns": str(group.last_seen_ns), "group_severity": group.severity}

    def _mark(self, group: Group, alert: Alert, state: str) -> Alert:
        summary = alert.summary
        if state == FIRING and group.count > 1:
            seconds = (group.last_seen_ns - group.first_seen_ns) / 1e9
            summary += (f" ({group.count} times in {seconds:.0f} s, worst {group.worst.wait_ns / 1e6:.1f} ms)")
        return msgspec.structs.replace(alert, summary=summary,
                                       evidence={**alert.evidence, **self._evidence(group, state)})

    def _resolve(self, group: Group, now_ns: int) -> Alert:
        """The group's worst alert, renamed as its resolution (its last alert's key)."""
        quiet = (now_ns - group.last_seen_ns) / 1e9
        seconds = (group.last_seen_ns - group.first_seen_ns) / 1e9
        worst, last = group.worst, group.latest
        summary = (f"resolved (quiet for {quiet:.0f} s): {group.count} alert(s) in {seconds:.0f} s, "
                   f"worst {worst.wait_ns / 1e6:.1f} ms: {worst.summary}")
        return msgspec.structs.replace(
            worst, boot_id=last.boot_id, seq=last.seq | RESOLVED_SEQ_BIT, ts_ns=last.ts_ns, raised_ns=now_ns,
            summary=summary, evidence={**worst.evidence, **self._evidence(group, RESOLVED)})
