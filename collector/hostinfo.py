# SPDX-License-Identifier: Apache-2.0
"""What the collector reads about its host from /proc and /sys.

Roots are parameters so tests read captured fixture trees instead of the
machine they run on.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, NamedTuple

from jitterscope.collector import containers
from jitterscope.collector.pacing import paced
from jitterscope.common.errors import BadConfig
from jitterscope.schemas.topology import parse_cpu_list

if TYPE_CHECKING:
    from jitterscope.collector.kubelet import KubeletPods


def host_roots(host_root: Path | str, proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> tuple[Path, Path]:
    """The host's /proc and /sys as seen from here: ``proc`` and ``sys`` under
    ``host_root`` (like node exporter's --path.procfs), so a collector in a
    container reads the host's through a mount (e.g. ``/host``). Raises
    BadConfig when the host's /proc is not there."""
    root = Path(host_root)
    if root == Path("/"):
        return proc, sys
    rooted = tuple(root.joinpath(*p.parts[1:]) if p.is_absolute() else root / p for p in (proc, sys))
    if not (rooted[0] / "1" / "status").is_file():
        raise BadConfig(f"host_root={root}: {rooted[0]} is not the host's /proc; mount the host's / there "
                        "(e.g. hostPath / at /host, read-only) or set host_root to where it is mounted")
    return rooted


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


def process_info(pid: int, proc: Path = Path("/proc"), kubelet: KubeletPods | None = None) -> dict:
    """The ProcessInfo fields /proc tells about ``pid`` (comm, cmdline, cgroup,
    allowed CPUs, parent, its pid in its own PID namespace, its container and
    pod), named by the kubelet where one is given; raises ProcessGone."""
    base = proc / str(pid)
    status = _status_fields(_read(base / "status").decode(errors="replace"))
    cgroup_text = _read(base / "cgroup").decode(errors="replace")
    cgroup = cpu_cgroup_path(cgroup_text)
    tgid = _int(status.get("Tgid"), pid)
    # NStgid, not NSpid: ``pid`` may be a thread, the record names its process.
    ns_ids = _ids(status.get("NStgid") or status.get("NSpid") or "")
    ref = containers.identity(cgroup_text)
    meta = kubelet.lookup(ref.pod_uid, ref.container_id) if kubelet is not None and ref.pod_uid else None
    return {
        "pid": tgid,
        "comm": _read(base / "comm").decode(errors="replace").strip(),
        "cmdline": _read(base / "cmdline").replace(b"\0", b" ").decode(errors="replace").strip(),
        "cgroup": cgroup,
        "memory_cgroup": cpu_cgroup_path(cgroup_text, "memory"),
        "cpus_allowed": parse_cpu_list(status.get("Cpus_allowed_list", "")),
        "ppid": _int(status.get("PPid"), 0),
        "ns_pid": ns_ids[-1] if ns_ids else tgid,
        "container_id": ref.container_id,
        "pod_uid": ref.pod_uid,
        "pod": meta.pod if meta else "",
        "namespace": meta.namespace if meta else "",
        "container": meta.container if meta else "",
    }


def cpu_cgroup_path(cgroup_text: str, controller: str = "cpu") -> str:
    """The cpu controller's cgroup in a /proc/PID/cgroup text: the one whose
    CFS quota can throttle the process (CgroupThrottle records name it the
    same way); or another ``controller``'s ("memory": whose limit it
    shares). cgroup v1 lists controllers per line; v2 is the single
    "0::/path" line; else the first; "" when there is none."""
    fields = [line.split(":", 2) for line in cgroup_text.splitlines() if line.count(":") >= 2]
    cgroup = next((f[2] for f in fields if controller in f[1].split(",")), None)
    if cgroup is None:
        cgroup = next((f[2] for f in fields if f[0] == "0" and not f[1]), None)
    if cgroup is None and fields:
        cgroup = fields[0][2]
    return cgroup or ""


def process_cgroup(pid: int, proc: Path = Path("/proc")) -> str:
    """``pid``'s cpu cgroup now (as `process_info` names it), from one small
    read: cheap enough to check at every target rescan whether a process was
    moved (``systemctl set-property``, ``cgclassify``, a supervisor). Raises
    ProcessGone."""
    return cpu_cgroup_path(_read(proc / str(pid) / "cgroup").decode(errors="replace"))


def comm_matches(comm: str, patterns: list[str]) -> bool:
    """Whether a process name matches any shell-style pattern (target_comms)."""
    from fnmatch import fnmatchcase

    return any(fnmatchcase(comm, p) for p in patterns)


def _status_fields(text: str) -> dict[str, str]:
    """/proc/PID/status as name -> value text."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name] = value.strip()
    return out


def _ids(text: str) -> list[int]:
    """An NSpid/NStgid value: the pid in each PID namespace, outermost first."""
    try:
        return [int(x) for x in text.split()]
    except ValueError:
        return []


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


class NsProcess(NamedTuple):
    """A process as a pid translation sees it."""

    pid: int  # on the host (in the namespace of the /proc read)
    inner: int  # in its own PID namespace: the last NSpid entry (= pid on the host)
    ref: containers.ContainerRef  # its container and pod, from its cgroup
    cgroup: str | None  # `containers.cgroup_path`


def ns_processes(proc: Path = Path("/proc")) -> list[NsProcess]:
    """Every process's NSpid and cgroup identity: one scan of /proc/*/status
    and /proc/*/cgroup (callers that translate often keep it a while)."""
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return []
    table = []
    for name in entries:
        try:
            ids = _ids(_status_fields((proc / name / "status").read_text(errors="replace")).get("NSpid", ""))
            text = (proc / name / "cgroup").read_text(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        if ids:
            table.append(NsProcess(int(name), ids[-1], containers.identity(text), containers.cgroup_path(text)))
    return table


def _members(table: Iterable[NsProcess], container_id: str | None, pod_uid: str | None,
             peer_cgroup: str | None) -> list[NsProcess]:
    """The processes of the container and/or pod, and/or of the cgroup
    ``peer_cgroup``; all of them when none is given."""
    return [p for p in table
            if (not (container_id or pod_uid) or p.ref.matches(container_id, pod_uid))
            and (peer_cgroup is None or p.cgroup == peer_cgroup)]


def host_pid_for(ns_pid: int, container_id: str | None = None, pod_uid: str | None = None,
                 peer_cgroup: str | None = None, proc: Path = Path("/proc"),
                 table: Iterable[NsProcess] | None = None) -> int | None:
    """The host pid of the process that is ``ns_pid`` in its own PID namespace
    (the last NSpid entry in /proc/*/status; = its pid on the host), among the
    processes of the container and/or pod given, or in the cgroup
    ``peer_cgroup`` (as `containers.cgroup_path` names it). None when no process or
    more than one matches: a guess would blame the wrong process. ``table``:
    an `ns_processes` scan to use instead of reading ``proc``."""
    table = ns_processes(proc) if table is None else table
    matches = [p.pid for p in _members(table, container_id, pod_uid, peer_cgroup) if p.inner == ns_pid]
    return matches[0] if len(matches) == 1 else None


def pid_in_container(ns_pid: int | None, container_id: str | None, pod_uid: str | None,
                     proc: Path = Path("/proc"), table: Iterable[NsProcess] | None = None) -> tuple[int | None, str]:
    """A host pid for a span from a container: the process whose innermost pid
    is ``ns_pid`` if exactly one is ("nspid"), else the lowest host pid of
    those that match or of the container/pod's processes ("container": the
    right serving stack, maybe not the right process), else (None, "none")."""
    if not (container_id or pod_uid):
        return None, "none"
    members = _members(ns_processes(proc) if table is None else table, container_id, pod_uid, None)
    exact = [p.pid for p in members if p.inner == ns_pid]
    if len(exact) == 1:
        return exact[0], "nspid"
    pool = exact or [p.pid for p in members]
    return (min(pool), "container") if pool else (None, "none")


def ns_pids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The NSpid entries of ``pid`` (outermost first; one entry on the host);
    [] when it is gone."""
    try:
        return _ids(_status_fields((proc / str(pid) / "status").read_text()).get("NSpid", ""))
    except OSError:
        return []


def own_role(pid: int, head: int = 0, proc: Path = Path("/proc")) -> str:
    """Which part of jitterscope one of its own processes is, as a person
    names it: "collector" (this process), "up" (``head``, the tree that
    started the others), "worker", "broker", else its name. A suspect label
    says this rather than a thread's name ("python", "tokio-rt-worker", a
    chDB pool's "RuntimeData"), which says nothing about what to tune."""
    if pid == os.getpid():
        return "collector"
    if pid == head:
        return "up"
    try:
        args = [Path(a.decode(errors="replace")).name for a in (proc / str(pid) / "cmdline").read_bytes().split(b"\0")]
    except OSError:
        return "process"
    for role, marks in (("worker", ("streams",)), ("collector", ("collector",))):
        if any(a in marks for a in args[1:]):
            return role
    if any(a.startswith("jitterscope.collector.") for a in args[1:]):
        return "collector"  # a helper the collector started (python -m jitterscope.collector.stacks)
    if args and args[0].startswith("tansu"):
        return "broker"
    return args[0] if args and args[0] else "process"


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
    found: set[int] = set()
    for entry in paced(os.scandir(proc)):  # the whole of /proc: yields the CPU every 0.5 ms (pacing.py)
        if not entry.name.isdigit():
            continue
        try:
            comm = (Path(entry.path) / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if comm_matches(comm, patterns):
            found.add(int(entry.name))
    return found
