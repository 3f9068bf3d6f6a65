# SPDX-License-Identifier: Apache-2.0
"""`jitterscope fix`, the plan (issue 35, its first step): the changes to
this host that would take the most off its serving group's tail latency,
ranked, each with exactly what it changes and its undo.

The gain of an action is computed, not guessed: every attributed request of
the window loses the part of its excess that the action's cause explains
(its cause's share; for a CPU neighbour, that share split by how long the
request's threads waited behind each suspect), and the serving group's P99
and P999 are taken again. The difference is the gain.

Only what jitterscope names is offered, and never at the serving group's
expense: a serving process is what the plan protects, never what it moves;
jitterscope's own processes, kernel threads and other containers' processes
are not moved; a move the host cannot make (no CPU outside the serving
group's) is not offered; and a serving group in a pod gets the pod-level
advice (the kubelet's CPU manager), not a taskset of its neighbours. Causes without a change jitterscope can make here
(the GIL, steal, a device) come as advice, with their gain all the same.

Pure but for ``read_live`` (this host's /proc), so tests drive the rest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from jitterscope.schemas.events import OWN_SUSPECT_PREFIX
from jitterscope.schemas.topology import cpu_list, parse_cpu_list

REQUESTS_SQL = """
    SELECT pid, duration_ns, excess_ns, cause, culprit, causes, suspects
    FROM jitterscope.request_attribution FINAL
    WHERE host = {host:String} AND ts > now64(9) - toIntervalSecond({since:UInt32})"""
PROCESSES_SQL = """
    SELECT pid, argMax(comm, ts), argMax(cpus_allowed, ts), argMax(serving_group, ts), argMax(container_id, ts)
    FROM jitterscope.processes WHERE host = {host:String} GROUP BY pid"""

#: what each cause's advice says where the plan has no change of its own to make
ADVICE = {
    "gil_contention": "the GIL: move the holder's work out of the serving process (a worker process, or "
                      "a C extension that releases the GIL); jitterscope changes no code",
    "steal": "hypervisor steal: dedicated vCPUs, or another host",
    "irq": "interrupts on the serving CPUs: set the IRQ's smp_affinity off them (/proc/irq/N/smp_affinity_list)",
    "memory_stall": "memory reclaim: give the evictor a memory limit of its own (systemd-run -p MemoryMax=...), "
                    "or memory.low for the serving cgroup",
    "io_wait": "blocking I/O on the serving thread: read ahead, or move the I/O off the request's path",
    "cfs_throttling": "a CPU limit throttles the serving group: raise its cgroup's cpu.max (or the pod's limit)",
    "self_contention": "the serving group's own busy threads outnumber its CPUs: give it more, or run fewer",
    # a pod's CPUs are the kubelet's to give: a taskset beside it would be undone, or fight it
    "pod_cpus": "the serving group runs in a pod: give it CPUs of its own (kubelet --cpu-manager-policy=static, a "
                "Guaranteed pod with integer CPU requests, --topology-manager-policy=single-numa-node)",
}
PF_KTHREAD = 0x00200000  # include/linux/sched.h
#: causes that name nothing to change
NOTHING_TO_DO = frozenset({"none", "unexplained"})


@dataclass(frozen=True)
class Request:
    """One attributed request of the serving group, as the plan reads it."""

    pid: int
    duration_ns: int
    excess_ns: int
    cause: str
    culprit: str
    causes: tuple[tuple[str, float], ...]  # (cause, share of the excess)
    suspects: tuple[tuple[int, str, int], ...]  # (pid, comm, ns its threads waited behind it)

    def explained_ns(self, cause: str) -> float:
        share = dict(self.causes).get(cause, 1.0 if cause == self.cause else 0.0)
        return self.excess_ns * share


@dataclass(frozen=True)
class Process:
    pid: int
    comm: str
    cpus_allowed: tuple[int, ...]
    serving_group: int = 0
    container_id: str = ""


@dataclass(frozen=True)
class Live:
    """What this host says now of a process: its CPUs, its start time (a
    reused pid has another), and every CPU one of its threads may use (a
    server that pins its serving thread leaves its span exporter, holding
    the GIL at times, on the others), read when the plan is made."""

    cpus_allowed: tuple[int, ...]
    start_ticks: int
    thread_cpus: tuple[int, ...] = ()
    # a kernel thread (PF_KTHREAD), told by the kernel: a stored record's empty command line is no proof
    # (a process described in the middle of its exec has one too)
    kernel: bool = False


@dataclass(frozen=True)
class Limit:
    """A cgroup's CPU limit as this host has it now: the file that holds it
    (v1 cpu.cfs_quota_us, v2 cpu.max), its text, and the text that lifts it."""

    file: str
    now: str  # "40000" (v1) or "40000 100000" (v2)
    lifted: str  # "-1" (v1) or "max" (v2)


@dataclass(frozen=True)
class MemoryHome:
    """Where a process's memory is charged now: its memory cgroup's
    cgroup.procs, the memory controller's root (where a cgroup of its own
    is made), and its anonymous memory (which no limit can reclaim without
    swap: a limit below it would be an OOM kill)."""

    procs: str
    root: str
    v2: bool
    anon_bytes: int = 0


@dataclass
class Confinement:
    """An evictor's memory cgroup of its own: the directory made, what is
    written in it before anyone moves in (its limit), and the processes
    moved into it (pid -> (start time, the cgroup.procs they leave)). What
    it holds stays charged where it was: the kernel moves no charges (v2
    never did; v1's memory.move_charge_at_immigrate refuses any value but 0
    on this VM's 6.18), so the fix acts on what it allocates and reads next."""

    dir: str
    writes: dict[str, str]
    moves: dict[int, tuple[int, str]] = field(default_factory=dict)


#: the cgroups `fix` makes for evictors (below the memory controller's root), and their default limit
CONFINED_PREFIX = "jitterscope-confined-"
CONFINE_BYTES = 256 << 20
#: how attribution names an evictor (streams/culprits.py)
EVICTOR = re.compile(r"(.+) \(pid (\d+)\)")


@dataclass
class Action:
    key: str  # stable: what --apply names
    cause: str
    target: str  # who or what it changes
    change: str = ""  # from what to what ("" for advice)
    advice: str = ""  # what to do by hand, where jitterscope makes no change
    gain_p99_ms: float = 0.0
    gain_p999_ms: float = 0.0
    requests: int = 0  # requests it explains part of
    #: a move: the processes (every one of the command's that held the serving CPUs), as they were when
    #: planned (pid -> (start time, CPUs)), and the CPUs they get
    moves: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    to_cpus: tuple[int, ...] = ()
    #: a file written (a cgroup's CPU limit): path -> (its text when planned, the text it gets)
    writes: dict[str, tuple[str, str]] = field(default_factory=dict)
    confine: Confinement | None = None  # an evictor given a memory cgroup of its own
    removed: dict[int, float] = field(default_factory=dict, repr=False)  # request index -> ns it takes off

    @property
    def command(self) -> str:
        """The change as a shell command ("" for advice)."""
        c = self.confine
        return "; ".join([*(f"taskset -apc {cpu_list(list(self.to_cpus))} {pid}" for pid in sorted(self.moves)),
                          *(f"echo {after} > {path}" for path, (_, after) in sorted(self.writes.items())),
                          *([f"mkdir {c.dir}", *(f"echo {text} > {path}" for path, text in c.writes.items()),
                             *(f"echo {pid} > {c.dir}/cgroup.procs" for pid in sorted(c.moves))] if c else [])])

    @property
    def undo(self) -> str:
        moves = sorted(self.moves.items())
        c = self.confine
        return "; ".join([*(f"taskset -apc {cpu_list(list(cpus))} {pid}" for pid, (_, cpus) in moves),
                          *(f"echo {before} > {path}" for path, (before, _) in sorted(self.writes.items())),
                          *([*(f"echo {pid} > {procs}" for pid, (_, procs) in sorted(c.moves.items())),
                             f"rmdir {c.dir}"] if c else [])])


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def plan(requests: list[Request], processes: dict[int, Process], host_cpus: Iterable[int],
         live: Callable[[int], Live | None],
         describe: Callable[[int], Process | None] = lambda pid: None,
         limit_of: Callable[[str], Limit | None] = lambda cgroup: None,
         memory_of: Callable[[int], MemoryHome | None] = lambda pid: None,
         confine_bytes: int = CONFINE_BYTES) -> tuple[list[Action], list[str]]:
    """(actions that take something off the P99 or P999, ranked by those
    gains, and lines on what was not offered and why). A neighbour is its
    command: every process of that name that held a serving CPU moves at once
    (one of five hogs moved leaves the other four in the way). ``describe``:
    a process as this host sees it now, for one whose record is not stored
    (yet: a busy collector describes new processes a little later).
    ``limit_of``: a cgroup's CPU limit as this host has it now (None: none,
    or gone); a throttled serving group's is lifted, but in a pod.
    ``memory_of``: where a process's memory is charged now (None: no memory
    controller, or gone); an evictor gets a memory cgroup of its own with
    ``confine_bytes`` (its page cache then reclaims its own, not the server's)."""
    processes = dict(processes)  # described ones are added: the caller's stays as it was
    serving = {pid for pid, p in processes.items() if p.serving_group} | {r.pid for r in requests}
    serving_cpus = {c for pid in serving for c in _cpus_of(pid, processes, live)}
    others = tuple(sorted(set(host_cpus) - serving_cpus))
    in_pod = any(processes[pid].container_id for pid in serving if pid in processes)
    actions: dict[str, Action] = {}
    not_offered: dict[int | str, str] = {}  # by pid, or by cgroup
    move_of: dict[int, Action] = {}  # a neighbour's pid -> its command's move
    for i, request in enumerate(requests):
        for cause, _share in request.causes or ((request.cause, 1.0),):
            explained = request.explained_ns(cause)
            if explained <= 0 or cause in NOTHING_TO_DO:
                continue
            if cause == "runq_starvation" and request.suspects and not in_pod:
                total = sum(ns for _, _, ns in request.suspects) or 1
                for pid, comm, ns in request.suspects:
                    if pid not in move_of and pid not in not_offered:  # decided once per process
                        if pid not in processes and (now := describe(pid)) is not None:
                            processes[pid] = now
                        why = _why_not_move(pid, comm, processes, serving, others)
                        if why or (why := _identify(pid, comm, others, live, actions, move_of)):
                            not_offered[pid] = f"{comm} (pid {pid}): not moved: {why}"
                    if pid in move_of:
                        removed = move_of[pid].removed
                        removed[i] = removed.get(i, 0.0) + explained * ns / total
                continue
            if cause == "cfs_throttling" and request.culprit and not in_pod and \
                    (lift := _lift(request.culprit, limit_of, actions, not_offered)):
                lift.removed[i] = lift.removed.get(i, 0.0) + explained
                continue
            if cause == "memory_stall" and (evictor := EVICTOR.fullmatch(request.culprit)) and (confine := _confine(
                    evictor[1], int(evictor[2]), processes, serving, live, describe, memory_of, confine_bytes,
                    actions, not_offered)):
                confine.removed[i] = confine.removed.get(i, 0.0) + explained
                continue
            key = f"advice:{cause}:{request.culprit}" if request.culprit else f"advice:{cause}"
            advice = ADVICE.get("pod_cpus" if in_pod and cause == "runq_starvation" else cause, "")
            action = actions.setdefault(key, Action(key, cause, request.culprit or "-", advice=advice))
            action.removed[i] = action.removed.get(i, 0.0) + explained
    durations = [float(r.duration_ns) for r in requests]
    ranked = [_gain(a, durations) for a in actions.values()]
    ranked.sort(key=lambda a: (-a.gain_p99_ms, -a.gain_p999_ms, a.key))
    return [a for a in ranked if a.gain_p99_ms > 0 or a.gain_p999_ms > 0], sorted(not_offered.values())


def _cpus_of(pid: int, processes: dict[int, Process], live) -> tuple[int, ...]:
    """Every CPU a serving process's threads may use now; its record's, once it has exited."""
    now = live(pid)
    if now is not None:
        return now.thread_cpus or now.cpus_allowed
    return processes[pid].cpus_allowed if pid in processes else ()


def _identify(pid: int, comm: str, others: tuple[int, ...], live, actions: dict[str, Action],
              move_of: dict[int, Action]) -> str:
    """Add ``pid`` to its command's move as it is now; why not, where it has exited."""
    now = live(pid)
    if now is None:
        return "it has exited"
    if now.kernel:
        return "a kernel thread"
    action = move_of[pid] = actions.setdefault(f"move:{comm}", Action(f"move:{comm}", "runq_starvation", comm,
                                                                       to_cpus=others))
    action.moves[pid] = (now.start_ticks, now.cpus_allowed)
    before = sorted({cpu_list(list(cpus)) for _, cpus in action.moves.values()})
    action.target = f"{comm} (pid {', '.join(map(str, sorted(action.moves)))})"
    action.change = f"CPU affinity {' / '.join(before)} -> {cpu_list(list(others))} (off the serving CPUs)"
    return ""


def _lift(cgroup: str, limit_of: Callable[[str], Limit | None], actions: dict[str, Action],
          not_offered: dict[int | str, str]) -> Action | None:
    """The action that lifts the CPU limit of the serving group's throttled cgroup, as it is now; None (and why,
    once) where it has none now."""
    key = f"lift:{cgroup}"
    if key not in actions and cgroup not in not_offered:
        limit = limit_of(cgroup)
        if limit is None:
            not_offered[cgroup] = f"cgroup {cgroup}: no CPU limit to lift now (lifted already, or gone)"
        else:
            actions[key] = Action(key, "cfs_throttling", f"cgroup {cgroup} (every process in it)",
                                  change=f"CPU limit {limit.file.rsplit('/', 1)[1]} {limit.now} -> {limit.lifted} "
                                         "(none)", writes={limit.file: (limit.now, limit.lifted)})
    return actions.get(key)


def _confine(comm: str, pid: int, processes: dict[int, Process], serving: set[int], live, describe,
             memory_of: Callable[[int], MemoryHome | None], limit_bytes: int, actions: dict[str, Action],
             not_offered: dict[int | str, str]) -> Action | None:
    """The action that gives evictor ``comm`` (every process of that name it
    named) a memory cgroup of its own; None (and why, once per process) where
    this one may not or cannot be moved."""
    if pid not in processes and (described := describe(pid)) is not None:
        processes[pid] = described  # its record not stored yet
    key = f"confine:{comm}"
    action = actions.get(key)
    if action is not None and action.confine and pid in action.confine.moves:
        return action
    if pid in not_offered:
        return None
    why = _why_not_changed(pid, comm, processes, serving)
    now = None if why else live(pid)
    home = memory_of(pid) if now is not None and not now.kernel else None
    if not why:
        why = ("it has exited" if now is None else "a kernel thread" if now.kernel else
               "no memory cgroup to move it from (no memory controller)" if home is None else
               "it has a memory cgroup of its own already" if CONFINED_PREFIX in home.procs else "")
    if why:
        not_offered[pid] = f"{comm} (pid {pid}): not confined: {why}"
        return None
    if action is None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", comm)  # a process names itself: never a path of its choosing
        folder = f"{home.root.rstrip('/')}/{CONFINED_PREFIX}{name}"
        limit = max(limit_bytes, 2 * home.anon_bytes)  # room for what it holds that only an OOM kill would free
        writes = {f"{folder}/{'memory.max' if home.v2 else 'memory.limit_in_bytes'}": str(limit)}
        action = actions[key] = Action(key, "memory_stall", comm, confine=Confinement(folder, writes),
                                       change=f"memory: a cgroup of its own, {folder}, limited to "
                                              f"{limit >> 20} MiB (its page cache reclaims its own)")
    action.confine.moves[pid] = (now.start_ticks, home.procs)
    action.target = f"{comm} (pid {', '.join(map(str, sorted(action.confine.moves)))})"
    return action


def _why_not_changed(pid: int, comm: str, processes: dict[int, Process], serving: set[int]) -> str:
    """Why a process the plan names may not be changed ("" when it may)."""
    record = processes.get(pid)
    if pid in serving or (record and record.serving_group):
        return "it is part of the serving group (the plan protects it)"
    if comm.startswith(OWN_SUSPECT_PREFIX):
        return "it is jitterscope's own (the cost of watching: see own_cpus)"
    if pid == 0:
        return "the kernel (interrupts, idle): see the irq advice"
    if record is None:
        return "no process record (it came and went)"
    if record.container_id:
        return "it runs in another container (move it through its orchestrator)"
    return ""


def _why_not_move(pid: int, comm: str, processes: dict[int, Process], serving: set[int], others: list[int]) -> str:
    """Why a neighbour may not be moved off the serving CPUs ("" when it may)."""
    if why := _why_not_changed(pid, comm, processes, serving):
        return why
    if not others:
        return "every CPU of this host is a serving CPU: there is nowhere to move it"
    return ""


def _gain(action: Action, durations: list[float]) -> Action:
    after = list(durations)
    for i, ns in action.removed.items():
        after[i] = max(0.0, after[i] - ns)
    for q, name in ((0.99, "gain_p99_ms"), (0.999, "gain_p999_ms")):
        setattr(action, name, round((percentile(durations, q) - percentile(after, q)) / 1e6, 1))
    action.requests = len(action.removed)
    return action


def read_live(pid: int, proc: Path = Path("/proc")) -> Live | None:
    """This host's view of ``pid`` now; None when it has exited."""
    try:
        status = (proc / str(pid) / "status").read_text()
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    threads = set()
    for task in (proc / str(pid) / "task").glob("*"):
        try:
            threads.update(_allowed((task / "status").read_text()))
        except OSError:
            continue  # it ended meanwhile
    # fields 22 (start time) and 9 (flags) of stat, counted after the command's closing parenthesis (a
    # name may hold spaces)
    fields = stat.rsplit(")", 1)[1].split()
    return Live(_allowed(status), int(fields[19]), tuple(sorted(threads)), bool(int(fields[6]) & PF_KTHREAD))


def _allowed(status: str) -> tuple[int, ...]:
    """The CPUs a /proc status text allows."""
    return tuple(parse_cpu_list(next((line.split(":", 1)[1].strip() for line in status.splitlines()
                                      if line.startswith("Cpus_allowed_list:")), "")))


def _fields(item) -> tuple:
    """A named tuple's fields in order, whether the store sent it as an object or an array."""
    return tuple(item.values()) if isinstance(item, dict) else tuple(item)


def requests_of(rows: list) -> list[Request]:
    return [Request(int(pid), int(duration), int(excess), cause, culprit,
                    tuple((c, float(s)) for c, s in map(_fields, causes)),
                    tuple((int(p), comm, int(ns)) for p, comm, ns in map(_fields, suspects)))
            for pid, duration, excess, cause, culprit, causes, suspects in rows]


def processes_of(rows: list) -> dict[int, Process]:
    return {int(pid): Process(int(pid), comm, tuple(int(c) for c in cpus), int(group), container)
            for pid, comm, cpus, group, container in rows}


def format_plan(actions: list[Action], not_offered: list[str], host: str, since: str, requests: int) -> list[str]:
    """The plan as lines for a terminal."""
    if not actions:
        return [f"{host}: nothing to fix in the last {since} ({requests} attributed request(s))", *not_offered]
    lines = [f"{host}: {len(actions)} action(s) from {requests} attributed request(s) of the last {since}, "
             "ranked by what they take off the serving group's P99:"]
    for n, a in enumerate(actions, 1):
        gain = f"P99 -{a.gain_p99_ms:g} ms, P999 -{a.gain_p999_ms:g} ms ({a.requests} request(s))"
        lines.append(f"{n}. [{a.key}] {a.cause}: {a.target}: {gain}")
        if a.command:
            lines += [f"     change: {a.change}", f"     apply:  {a.command}", f"     undo:   {a.undo}"]
        elif a.advice:
            lines.append(f"     advice: {a.advice}")
    if not_offered:
        lines += ["not offered:", *(f"  {line}" for line in not_offered)]
    return lines
