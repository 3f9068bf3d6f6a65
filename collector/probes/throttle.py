# SPDX-License-Identifier: Apache-2.0
"""The "cfs" signal: CFS bandwidth throttling of the watched processes'
cgroups, from the kernel's own counters (no BPF program: cpu.stat has them).

Which cgroups: those of the target processes and their ancestors (a pod's
quota sits on the pod cgroup above its containers'); when every process is
watched, every cgroup with a quota, found again on each ``rescan``. Only a
cgroup with a quota can be throttled, so only those are sampled.

cgroup v1 (``cpu`` or ``cpu,cpuacct`` hierarchy): cpu.cfs_quota_us (-1 = no
limit), cpu.cfs_period_us, cpu.stat ``nr_periods nr_throttled
throttled_time`` (ns). cgroup v2: cpu.max ("max 100000" or "20000 100000")
and cpu.stat ``nr_periods nr_throttled throttled_usec``.

A record (deltas) goes out every ``cfs_interval_s`` for each cgroup that ran
under its quota in that interval (nr_periods grew): idle ones make none, and
a run of records tells the streams worker up to when a cgroup is covered.
Roots come from the probe context (a collector in a container sees the
host's /proc and /sys elsewhere).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.probes.sampled import SampledSignal
from jitterscope.schemas import events


@dataclass(frozen=True)
class Cgroup:
    """A process's cgroup of one controller (cpu, memory)."""

    path: str   # below the controller's root, "/" for the root
    dir: Path   # its directory
    v2: bool


@dataclass(frozen=True)
class CpuStat:
    quota_us: int  # -1: no limit
    period_us: int
    nr_periods: int
    nr_throttled: int
    throttled_ns: int


def _join(root: Path, path: str) -> Path:
    return root / path.lstrip("/") if path.strip("/") else root


def cpu_cgroup(cgroup_file: str, sys: Path = Path("/sys")) -> Cgroup | None:
    """The cpu-controller cgroup named in a /proc/PID/cgroup text: the v1
    line whose controllers include cpu, else the v2 ("0::") line where the
    v2 hierarchy has the cpu controller. None when neither is mounted."""
    return controller_cgroup(cgroup_file, "cpu", sys)


def controller_cgroup(cgroup_file: str, controller: str, sys: Path = Path("/sys")) -> Cgroup | None:
    """The cgroup of ``controller`` (cpu, memory) named in a /proc/PID/cgroup
    text, as cpu_cgroup finds the cpu controller's."""
    root = sys / "fs/cgroup"
    v2_path = None
    joint = ("cpu,cpuacct", "cpuacct,cpu") if controller == "cpu" else ()  # v1 mounts cpu and cpuacct together
    for line in cgroup_file.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            v2_path = path
        elif controller in controllers.split(","):
            for mount in (controllers, controller, *joint):
                if (root / mount).is_dir():
                    return Cgroup(path, _join(root / mount, path), False)
    if v2_path is not None:
        for mount in (root, root / "unified"):  # pure v2, or the hybrid layout's v2 part
            if controller in read_or_empty(mount / "cgroup.controllers").split():
                return Cgroup(v2_path, _join(mount, v2_path), True)
    return None


def read_or_empty(path: Path) -> str:
    """A cgroup or /proc file's text; "" when it cannot be read (gone, or never there)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def read_stat(group: Cgroup) -> CpuStat | None:
    """The cgroup's limit and cumulative throttling counters (None if it is gone)."""
    stat = dict(line.split(maxsplit=1) for line in read_or_empty(group.dir / "cpu.stat").splitlines() if " " in line)
    if "nr_periods" not in stat:  # gone, or read while its file was empty: no reading (never a reset to 0)
        return None
    try:
        if group.v2:
            limit = read_or_empty(group.dir / "cpu.max").split()
            if len(limit) != 2:
                return None
            quota = -1 if limit[0] == "max" else int(limit[0])
            period, throttled = int(limit[1]), int(stat.get("throttled_usec", 0)) * 1000
        else:
            quota = int(read_or_empty(group.dir / "cpu.cfs_quota_us"))
            period, throttled = int(read_or_empty(group.dir / "cpu.cfs_period_us")), int(stat.get("throttled_time", 0))
        return CpuStat(quota, period, int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0)), throttled)
    except ValueError:  # removed while read (empty files)
        return None


def ancestors(group: Cgroup) -> list[Cgroup]:
    """The cgroup and each parent up to (not including) the root."""
    out, path, d = [], group.path.rstrip("/"), group.dir
    while path:
        out.append(Cgroup(path, d, group.v2))
        path, d = path.rsplit("/", 1)[0], d.parent
    return out


def quota_cgroups(sys: Path = Path("/sys")) -> list[Cgroup]:
    """Every cgroup with a CPU quota on the host (the cpu hierarchy walked)."""
    probe = cpu_cgroup("1:cpu:/\n0::/", sys)  # where the cpu hierarchy's root is, v1 first
    if probe is None:
        return []
    out = []
    for d, subdirs, _ in os.walk(probe.dir):
        rel = os.path.relpath(d, probe.dir)
        if rel == ".":
            continue  # the root has no quota
        group = Cgroup("/" + rel, Path(d), probe.v2)
        limit = read_or_empty(Path(d) / ("cpu.max" if probe.v2 else "cpu.cfs_quota_us")).split()
        if limit and limit[0] not in ("max", "-1"):
            out.append(group)
    return out


class ThrottleSignal(SampledSignal):
    """CFS throttling deltas of the quota cgroups above the watched
    processes (every quota cgroup when all are watched)."""

    name = "throttle"
    publishes = (events.CgroupThrottle,)

    def open(self, context: ProbeContext) -> None:
        self._targets = context.targets
        self._serving = set(context.thresholds)  # the serving groups' processes
        self._groups: dict[str, Cgroup] = {}
        self._seen: dict[str, CpuStat] = {}
        self._cgroup_files: dict[int, str] = {}  # pid -> its /proc/PID/cgroup when last looked at
        self.moved: set[int] = set()  # seen moved by the sampler, not yet described again
        self.start_clock(context, context.settings.cfs_interval_s)
        self.rescan()

    def set_targets(self, targets: set[int] | None, thresholds: dict[int, int]) -> None:
        self._targets = targets
        self._serving = set(thresholds)
        self.rescan()

    def _watched(self) -> set[int]:
        """The processes whose moves matter at once: the serving groups'
        (their requests are attributed from their waits). Other targets
        are followed at the rescan (2 s): a filter by name may match
        hundreds, four reads a second each."""
        return set(self._serving)

    def _look_for_moves(self) -> bool:
        """On the sampler's clock (0.25 s), not the rescan's (2 s): a serving
        process moved into a quota cgroup is throttled from its first
        period there, and until its new cgroup is sampled and its record
        says so, its requests' waits would be charged to whoever ran.
        Whether any moved (each is in ``moved``). A few small reads."""
        files = {}
        for pid in sorted(self._watched()):
            text = read_or_empty(self.ctx.proc / str(pid) / "cgroup")
            if text:
                files[pid] = text
        moved = {pid for pid, text in files.items() if self._cgroup_files.get(pid, text) != text}
        self._cgroup_files = files
        self.moved |= moved
        return bool(moved)

    def rescan(self) -> None:
        """Find the cgroups to sample again: processes move, containers come and go."""
        if not hasattr(self, "lock"):
            return
        with self.lock:
            self._look_for_moves()  # what rescan reads now is the baseline
            self._find_groups()

    def _find_groups(self) -> None:
        """The cgroups to sample (under ``lock``); a new one's baseline is now."""
        if self._targets is None:
            groups = quota_cgroups(self.ctx.sys)
        else:
            groups = []
            for pid in sorted(self._targets):
                group = cpu_cgroup(read_or_empty(self.ctx.proc / str(pid) / "cgroup"), self.ctx.sys)
                groups.extend(ancestors(group) if group else [])
        self._groups = {g.path: g for g in groups}
        for path in list(self._seen):
            if path not in self._groups:
                del self._seen[path]
        for path, group in self._groups.items():  # a new cgroup's baseline: counted from now
            if path not in self._seen and (stat := read_stat(group)):
                self._seen[path] = stat

    def read(self) -> list[tuple[str, CpuStat, CpuStat]]:
        """(cgroup, before, now) of the quota cgroups that ran under their quota since the last read."""
        if self._look_for_moves():
            self._find_groups()
        out = []
        for path, group in sorted(self._groups.items()):
            stat = read_stat(group)
            if stat is None:
                continue
            before = self._seen.get(path)
            self._seen[path] = stat
            if before is not None and stat.quota_us >= 0 and stat.nr_periods > before.nr_periods:
                out.append((path, before, stat))  # not: a baseline, no limit, or it did not run
        return out

    def poll(self, timeout_ms: int = 0) -> None:
        """The readings (SampledSignal.poll); then, on the agent's thread,
        the records of processes the sampler saw move."""
        super().poll(timeout_ms)
        if self.moved:
            with self.lock:
                moved, self.moved = self.moved, set()
            for pid in sorted(moved):
                self.ctx.describe_again(pid)

    def records(self, reading: list[tuple[str, CpuStat, CpuStat]], interval_ns: int,
                now_ns: int) -> list[events.Record]:
        return [self.ctx.record(
            events.CgroupThrottle, now_ns, cgroup=path, interval_ns=interval_ns, quota_us=stat.quota_us,
            period_us=stat.period_us, nr_periods=stat.nr_periods - before.nr_periods,
            nr_throttled=max(0, stat.nr_throttled - before.nr_throttled),
            throttled_ns=max(0, stat.throttled_ns - before.throttled_ns)) for path, before, stat in reading]
