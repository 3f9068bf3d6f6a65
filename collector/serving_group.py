# SPDX-License-Identifier: Apache-2.0
"""A request's serving group: the processes whose waits can delay it.

The process that sends a request span is rarely the only one doing the work:
vLLM V1's API server emits the span while its ``VLLM::EngineCore`` child runs
the engine loop and, with tensor parallelism, GPU workers run in further
children; Triton, TGI and SGLang are similar. Modes (setting
``serving_group``):

- ``process``: the span's process alone (the old behaviour).
- ``tree``: it and its descendants (``/proc/*/stat`` ppid), which is vLLM V1
  with one API server on a bare host.
- ``cgroup``: it and every process in exactly its cgroups (all hierarchies),
  which is a container, or a systemd unit on a bare host.
- ``auto`` (default): ``tree``, plus ``cgroup`` when the span process runs in
  a container (its own PID namespace, or a container ID in its cgroup path):
  in a pod every process of the serving container counts, while on a bare
  host the cgroup is often a login session or the root, which would sweep in
  unrelated processes (the very neighbours being blamed).

The host's root cgroup is never a group: it would be every process. A group
is bounded (MAX_MEMBERS, nearest descendants first) so that a fork bomb cannot
fill the probes' target maps. Pure over a ``/proc`` root, so tests use fixture
trees.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from jitterscope.collector.pacing import paced

MAX_MEMBERS = 256  # processes per group at most, the span's own first


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
        return None


def _ppid(stat: str) -> int | None:
    """The 4th field of /proc/PID/stat (the comm, 2nd, may hold spaces and
    ')'); None for a zombie: it has no threads left to wait."""
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[0] != "Z" else None


def _pids(proc: Path) -> list[int]:
    return [int(e.name) for e in os.scandir(proc) if e.name.isdigit()]


def _kernel_children(pid: int, proc: Path) -> list[int] | None:
    """``pid``'s children from the kernel's own lists (/proc/PID/task/*/children,
    each thread's forks): a tree without reading every process on the host;
    [] when it is gone, None where the kernel keeps no such list
    (CONFIG_PROC_CHILDREN off) or a captured tree lacks it."""
    try:
        tasks = os.listdir(proc / str(pid) / "task")
    except OSError:
        return None if (proc / str(pid)).is_dir() else []
    found: list[int] = []
    for tid in tasks:
        text = _read(proc / str(pid) / "task" / tid / "children")
        if text is None:
            return None if (proc / str(pid)).is_dir() else []
        found += [int(c) for c in text.split()]
    return found


class _ChildrenOnDemand(dict):
    """ppid -> its live children, asked of the kernel per process reached
    (a zombie, still on its parent's list, is left out as the scan does)."""

    def __init__(self, proc: Path):
        super().__init__()
        self.proc = proc

    def __missing__(self, pid: int) -> list[int]:
        kids = [c for c in paced(_kernel_children(pid, self.proc) or [])
                if (stat := _read(self.proc / str(c) / "stat")) and _ppid(stat) == pid]
        self[pid] = kids
        return kids


def _is_root_cgroup(text: str) -> bool:
    return all(line.rsplit(":", 1)[-1] == "/" for line in text.splitlines() if line)


def in_container(pid: int, proc: Path, container_id: str = "") -> bool:
    """A container ID was found in its cgroup, or it lives in another PID
    namespace than the host's init (compared through ``proc``, so a
    collector with the host's /proc mounted elsewhere judges the host's)."""
    if container_id:
        return True
    try:
        return os.readlink(proc / str(pid) / "ns/pid") != os.readlink(proc / "1/ns/pid")
    except OSError:
        return False


def find_groups(heads: set[int], mode: str, proc: Path = Path("/proc"),
                containers: set[int] | None = None) -> dict[int, int]:
    """member pid -> the head (span process) whose group it is in; each head
    maps to itself. ``containers``: the heads that run in a container (for
    ``auto``). A process in two groups stays in the lowest head's."""
    alive = {h for h in heads if (proc / str(h)).is_dir()}
    groups: dict[int, int] = {h: h for h in alive}
    if mode == "process" or not alive:
        return groups
    wanted: dict[int, list[int]] = {h: [] for h in alive}
    if mode in ("tree", "auto"):
        children: dict[int, list[int]] = _ChildrenOnDemand(proc)  # the group's processes only, not all of /proc
        if _kernel_children(min(alive), proc) is None:  # no kernel lists here: every process's parent
            children = defaultdict(list)
            for pid in paced(_pids(proc)):  # the whole of /proc: yields the CPU every 0.5 ms (pacing.py)
                stat = _read(proc / str(pid) / "stat")
                ppid = _ppid(stat) if stat else None
                if ppid:
                    children[ppid].append(pid)
        for head in alive:
            queue = list(children[head])  # breadth first: nearest descendants first
            while queue and len(wanted[head]) < MAX_MEMBERS:
                pid = queue.pop(0)
                wanted[head].append(pid)
                queue.extend(children[pid])
    by_cgroup = [h for h in alive if mode == "cgroup" or (mode == "auto" and h in (containers or ()))]
    if by_cgroup:
        cgroups = {h: _read(proc / str(h) / "cgroup") for h in by_cgroup}
        cgroups = {h: text for h, text in cgroups.items() if text and not _is_root_cgroup(text)}
        if cgroups:
            for pid in paced(_pids(proc)):
                text = _read(proc / str(pid) / "cgroup")
                for head, mine in cgroups.items():
                    if text == mine:
                        wanted[head].append(pid)
    for head in sorted(alive):
        for pid in wanted[head][:MAX_MEMBERS]:
            groups.setdefault(pid, head)
    return groups
