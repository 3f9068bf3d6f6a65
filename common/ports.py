# SPDX-License-Identifier: Apache-2.0
"""Ports jitterscope listens on: check each before listening, and when
another process holds one, refuse in one line that names the port, the
setting that moves it and -- where /proc tells -- the process holding it:

    port 4318 (127.0.0.1) for the collector's OTLP receiver is taken, held by
    tansu (pid 1234): stop it, or move ours with --set otlp_port=PORT
    (JITTERSCOPE_OTLP_PORT; 0 turns it off)

`up` checks all its ports before it starts anything (a second `up` on a
host says so at once, instead of starting a worker and a collector that die
with a traceback); each daemon checks its own at start, and turns the
``EADDRINUSE`` of a port taken in between into the same line (`refusing`).

The holder: the socket listening on the port, from /proc/net/tcp{,6} (this
network namespace's), and the process with ``socket:[inode]`` among its fds.
Reading other users' fds needs root; without it the line says how to look.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jitterscope.common import errors

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_TIME_WAIT = "06"


@dataclass(frozen=True)
class Listener:
    """One port a jitterscope process listens on."""

    what: str  # "the collector's OTLP receiver"
    setting: str  # the setting that moves it: "otlp_port"
    port: int
    bind: str = "127.0.0.1"
    zero: str = "turns it off"  # what ``setting=0`` does


def probe(bind: str, port: int) -> OSError | None:
    """The error listening on ``bind:port`` would get now; None when free.

    SO_REUSEADDR as every listener of ours has it (http.server, aiohttp,
    Tansu): a connection in TIME_WAIT does not hold the port, a listener does.
    """
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
            s.listen(1)
        except OSError as exc:
            return exc
    return None


def tcp_sockets(proc: Path = Path("/proc")) -> Iterator[list[str]]:
    """The fields of every row of /proc/net/tcp and tcp6 (local address,
    remote address and state at 1, 2 and 3, the inode at 9)."""
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9:
                yield fields


def listening_inodes(port: int, proc: Path = Path("/proc")) -> list[int]:
    """Inodes of the sockets bound to ``port`` here, listeners first."""
    found: list[tuple[bool, int]] = []
    for fields in tcp_sockets(proc):
        try:
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            state, inode = fields[3], int(fields[9])
        except ValueError:
            continue
        # inode 0: no process holds it any more; TIME_WAIT holds nothing
        if local_port == port and inode and state != _TIME_WAIT:
            found.append((state != _LISTEN, inode))
    return [inode for _, inode in sorted(found)]


def pid_holding(inode: int, proc: Path = Path("/proc"), first: int | None = None) -> int | None:
    """The pid of a process with socket ``inode`` open (``first``: the
    likeliest, looked at before the rest), or None."""
    target = f"socket:[{inode}]"
    try:
        pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    if first is not None and str(first) in pids:
        pids.insert(0, str(first))
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) == target:
                    return int(pid)
            except OSError:
                continue
    return None


def holder(port: int, proc: Path = Path("/proc")) -> tuple[int, str] | None:
    """(pid, command name) of the process holding ``port``, or None when
    /proc does not say (another user's process without root, another
    network namespace's socket, or nothing)."""
    for inode in listening_inodes(port, proc):
        pid = pid_holding(inode, proc)
        if pid is not None:
            try:
                comm = (proc / str(pid) / "comm").read_text().strip()
            except OSError:
                comm = "?"
            return pid, comm
    return None


def _script(pid: int, proc: Path) -> str:
    """An interpreter's script or module (``-m jitterscope.cli streams``):
    its name alone (python) says little."""
    try:
        args = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")[1:]
    except OSError:
        return ""
    text = " ".join(a.decode(errors="replace") for a in args if a)
    text = "".join(c if c.isprintable() else "?" for c in text)  # another user's bytes
    return text if len(text) <= 60 else text[:57] + "..."


def taken(listener: Listener, proc: Path = Path("/proc")) -> str:
    """The one line that says ``listener``'s port is taken, by whom, and how
    to move ours."""
    who = holder(listener.port, proc)
    script = _script(who[0], proc) if who and who[1].startswith(("python", "java", "node", "ruby", "perl")) else ""
    held = (f"held by {who[1]} (pid {who[0]}{': ' + script if script else ''})" if who else
            f"by a process /proc does not name (see: ss -ltnp 'sport = :{listener.port}')")
    return (f"port {listener.port} ({listener.bind}) for {listener.what} is taken, {held}: stop it, or move ours "
            f"with --set {listener.setting}=PORT (JITTERSCOPE_{listener.setting.upper()}; 0 {listener.zero})")


def require_free(*listeners: Listener, proc: Path = Path("/proc")) -> None:
    """Raise `errors.PortTaken` naming every listener whose port is taken
    (one line each), or set twice; port 0 (off, or any free one) is never
    checked."""
    problems: list[str] = []
    seen: dict[int, Listener] = {}
    for listener in listeners:
        if not listener.port:
            continue
        if listener.port in seen:
            first = seen[listener.port]
            problems.append(f"port {listener.port} is set for both {first.what} ({first.setting}) and "
                            f"{listener.what} ({listener.setting}): move one with --set {listener.setting}=PORT")
            continue
        seen[listener.port] = listener
        exc = probe(listener.bind, listener.port)
        if exc is None:
            continue
        if exc.errno == errno.EADDRINUSE:
            problems.append(taken(listener, proc))
        else:  # EADDRNOTAVAIL, EACCES, ...: the bind address or the port itself will not do
            raise errors.BadConfig(
                f"cannot listen on {listener.bind}:{listener.port} for {listener.what} "
                f"({exc.strerror or exc}): check {listener.setting} and its bind address")
    if problems:
        raise errors.PortTaken("\n".join(problems))


@contextmanager
def refusing(listener: Listener, proc: Path = Path("/proc")):
    """Around the code that binds ``listener``'s port: a port taken since it
    was checked raises the same one line, not an ``OSError`` traceback."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise errors.PortTaken(taken(listener, proc)) from None


# -- the listeners of jitterscope's own processes -----------------------------

def broker_listener(port: int, bind: str = "127.0.0.1") -> Listener:
    return Listener("the embedded broker", "broker_port", port, bind, "picks a free one")


def streams_listeners(s) -> list[Listener]:
    """The streams worker's (``s``: its Settings)."""
    return [Listener("the streams worker's web port (/metrics, /query)", "streams_web_port",
                     s.streams_web_port, s.streams_web_bind)]


def judge_listeners(s) -> list[Listener]:
    """The judge stage's (streams/stages.py; ``s``: its Settings)."""
    return [Listener("the judge stage's /metrics", "judge_web_port", s.judge_web_port, s.streams_web_bind)]


def attribute_listeners(s) -> list[Listener]:
    """The attribution stage's (streams/stages.py; ``s``: its Settings)."""
    return [Listener("the attribution stage's /metrics", "attribute_web_port", s.attribute_web_port,
                     s.streams_web_bind)]


def stage_listeners(stage: str, s) -> list[Listener]:
    """What a streams process of ``stage`` listens on."""
    return {"judge": judge_listeners, "attribute": attribute_listeners}.get(stage, streams_listeners)(s)


def collector_listeners(s) -> list[Listener]:
    """The collector's (``s``: its Settings)."""
    return [Listener("the collector's /metrics", "collector_metrics_port", s.collector_metrics_port,
                     s.collector_metrics_bind),
            Listener("the collector's OTLP receiver", "otlp_port", s.otlp_port, s.otlp_bind)]
