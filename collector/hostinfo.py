"""What the collector reads about its host from /proc and /sys.

Roots are parameters so tests read captured fixture trees instead of the
machine they run on.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from jitterscope.schemas.topology import parse_cpu_list


def hostname() -> str:
    return socket.gethostname()


def boot_id(proc: Path = Path("/proc")) -> str:
    return (proc / "sys/kernel/random/boot_id").read_text().strip()


def online_cpus(sys: Path = Path("/sys")) -> list[int]:
    return parse_cpu_list((sys / "devices/system/cpu/online").read_text())


def numa_nodes(sys: Path = Path("/sys")) -> dict[int, list[int]]:
    """node id -> its CPUs; a kernel without NUMA counts as one node 0."""
    base = sys / "devices/system/node"
    nodes: dict[int, list[int]] = {}
    if base.is_dir():
        for entry in sorted(base.glob("node[0-9]*")):
            nodes[int(entry.name[4:])] = parse_cpu_list((entry / "cpulist").read_text())
    return nodes or {0: online_cpus(sys)}


class ProcessGone(Exception):
    pass


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(str(path)) from exc


def process_info(pid: int, proc: Path = Path("/proc")) -> dict:
    """comm, cmdline, cgroup and allowed CPUs of ``pid``; raises ProcessGone."""
    base = proc / str(pid)
    status = _read(base / "status").decode(errors="replace")
    cpus_allowed: list[int] = []
    tgid = pid
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus_allowed = parse_cpu_list(line.split(":", 1)[1])
        elif line.startswith("Tgid:"):
            tgid = int(line.split(":", 1)[1])
    cgroup_lines = _read(base / "cgroup").decode(errors="replace").splitlines()
    # cgroup v2 is the single "0::/path" line; v1 lists controllers, take the first.
    cgroup = next((l.split(":", 2)[2] for l in cgroup_lines if l.startswith("0::")), None)
    if cgroup is None and cgroup_lines:
        cgroup = cgroup_lines[0].split(":", 2)[-1]
    return {
        "pid": tgid,
        "comm": _read(base / "comm").decode(errors="replace").strip(),
        "cmdline": _read(base / "cmdline").replace(b"\0", b" ").decode(errors="replace").strip(),
        "cgroup": cgroup or "",
        "cpus_allowed": cpus_allowed,
    }


def tgid_of(tid: int, proc: Path = Path("/proc")) -> int | None:
    """The process a thread belongs to, or None if it is gone."""
    try:
        status = (proc / str(tid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("Tgid:"):
            return int(line.split(":", 1)[1])
    return None


def pids_matching(patterns: list[str], proc: Path = Path("/proc")) -> set[int]:
    """Processes whose comm matches any shell-style pattern."""
    from fnmatch import fnmatchcase

    found: set[int] = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            comm = (Path(entry.path) / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if any(fnmatchcase(comm, p) for p in patterns):
            found.add(int(entry.name))
    return found
