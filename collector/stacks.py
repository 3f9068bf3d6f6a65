# SPDX-License-Identifier: Apache-2.0
"""Stacks at alarm: addresses from the kernel -> symbolized frames -> StackTrace records.

The run-queue probe (bpf/runq.bpf.c) sends the victim's and the suspect's
kernel and user stacks inside its event (raw addresses, innermost first; why
not BPF_STACK_TRACE ids is said there). The id a record carries is a 64-bit
hash of the process name and the symbolized frames, so the same code path
gets the same id on every host and after every restart: a fleet-wide query
can add up "the stacks that caused the most waiting". Frames are function
names without offsets, for the same reason (a busy loop is caught at many
instruction addresses).

Each distinct stack is published once (a bounded memory of what was sent; the
``stacks`` table is keyed by (host, stack_id), so a re-send after the memory
forgot it replaces, not adds), and before the first event that refers to it.

User frames are resolved in a helper process (``python -m
jitterscope.collector.stacks``), never in the collector. libbcc 0.26, the
one Debian 12 ships, builds a ``ProcSyms::ModulePath`` for the global
``/tmp/perf-PID.map`` without setting its fd, and its destructor closes
whatever integer the reused heap chunk held (fixed in bcc 0.33,
iovisor/bcc#5193; checked here by disassembling the 0.26 library). Every
symbol cache it builds can so close a random fd; in the collector that was a
BPF map's, and the next map update failed with "Bad file descriptor" and ended
the collector. In the helper a stray close can hit only the helper: its pipe
ends sit at high fd numbers, and if it dies anyway the collector starts
another and names the frames it could not resolve ``[unknown]``. Kernel
frames (BCC's KSyms, no such object) stay in the collector.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import subprocess
import sys
import time
import weakref
from collections import OrderedDict
from typing import BinaryIO, Callable

MAX_PROCESSES = 64          # user symbol tables kept (ELF symbols of a process: MBs)
MAX_FRAMES_PER_PROCESS = 8192
MAX_PUBLISHED = 65536       # stack ids already sent
UNKNOWN = "[unknown]"


class _Lru(OrderedDict):
    """An OrderedDict that drops its oldest entry past ``limit`` (calling
    ``on_evict`` with it)."""

    def __init__(self, limit: int, on_evict: Callable | None = None):
        super().__init__()
        self.limit, self.on_evict = limit, on_evict

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            old_key, old = self.popitem(last=False)
            if self.on_evict:
                self.on_evict(old_key, old)


class Symbolizer:
    """Addresses -> function names: the kernel's via BCC's ksym, a process's
    through the helper process (module docstring), with the names already
    resolved kept here per process (bounded) and dropped when the process
    exits (``forget``)."""

    def __init__(self, max_processes: int = MAX_PROCESSES, helper: "UserSymbolsHelper | None" = None):
        self.helper = helper or UserSymbolsHelper()
        self._processes = _Lru(max_processes, lambda pid, _names: self.helper.forget({pid}))
        self._kernel: dict[int, str] = {}

    def kernel(self, addrs: list[int]) -> list[str]:
        from bcc import BPF

        if len(self._kernel) > MAX_FRAMES_PER_PROCESS:
            self._kernel.clear()
        out = []
        for addr in addrs:
            name = self._kernel.get(addr)
            if name is None:
                name = self._kernel[addr] = BPF.ksym(addr).decode(errors="replace")
            out.append(name)
        return out

    def warm(self) -> None:
        """Do now what the first stack would wait for: BCC reads the kernel's
        symbol table on its first look-up, and the helper takes a Python start
        and BCC's import. Paid inline, that was the first alerts' 0.6 s in a
        starvation storm (bench/RESULTS.md)."""
        from bcc import BPF

        BPF.ksym(0)
        self.helper.start()

    def user(self, addrs: list[int], pid: int) -> list[str]:
        names = self._processes.get(pid)
        if names is None:
            names = {}
        self._processes.put(pid, names)
        if len(names) > MAX_FRAMES_PER_PROCESS:
            names.clear()
        missing = [a for a in dict.fromkeys(addrs) if a not in names]
        if missing:
            resolved = self.helper.resolve(pid, missing)
            if resolved is None:  # the helper failed: these frames unknown, not remembered (the next try may do)
                return [names.get(a, UNKNOWN) for a in addrs]
            names.update(zip(missing, resolved))
        return [names[a] for a in addrs]

    def forget(self, pids: set[int]) -> None:
        gone = pids & self._processes.keys()
        for pid in gone:
            del self._processes[pid]
        if gone:
            self.helper.forget(gone)

    def close(self) -> None:
        self._processes.clear()
        self.helper.close()


_running_helpers: set[int] = set()  # pids, for the collector's list of its own processes


def helper_pids() -> set[int]:
    """The helper processes running now (jitterscope's own: never a victim)."""
    return set(_running_helpers)


class UserSymbolsHelper:
    """The collector's end of the helper process: one JSON line per request
    (``{"pid", "addrs"}`` -> a list of names; ``{"forget": [pids]}`` -> no
    reply). Started on first use; a helper that dies or does not answer in
    ``timeout_s`` is killed, counted in ``restarts`` and started again on the
    next request. ``own``: the collector's own processes (pid -> role), where
    each helper is entered as it starts, not at the collector's next rescan:
    one started in a run-queue storm ran beside the victims unlabelled."""

    def __init__(self, timeout_s: float = 10.0, own: dict[int, str] | None = None):
        self.timeout_s = timeout_s  # a large library's symbol table is read on its first frame
        self.own = own
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._pending = b""  # what the helper wrote past the last full line

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def resolve(self, pid: int, addrs: list[int]) -> list[str] | None:
        """The names of ``addrs`` in process ``pid``; None if the helper
        failed twice (a helper found dead is replaced once, at once)."""
        for _attempt in range(2):
            try:
                proc = self._proc or self._start()
                self._send({"pid": pid, "addrs": addrs})
                names = json.loads(self._reply(proc))
                if isinstance(names, list) and len(names) == len(addrs):
                    return [str(n) for n in names]
            except (OSError, ValueError, TimeoutError, EOFError):
                pass
            self._stop(failed=True)
        return None

    def start(self) -> None:
        """Start the helper now rather than on first use (it answers once
        it has imported BCC; nothing waits for that here)."""
        if self._proc is None:
            self._start()

    def forget(self, pids: set[int]) -> None:
        if self._proc:
            try:
                self._send({"forget": sorted(pids)})
            except OSError:
                self._stop(failed=True)

    def close(self) -> None:
        self._stop(failed=False)

    def _start(self) -> subprocess.Popen:
        # -P and cwd "/": else `-m` imports from the collector's working directory first (a planted
        # jitterscope/collector/stacks.py there ran as root); the helper reads only absolute /proc paths
        self._proc = subprocess.Popen([sys.executable, "-P", "-m", __name__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, bufsize=0, close_fds=True, cwd="/")
        self._pending = b""
        _running_helpers.add(self._proc.pid)
        if self.own is not None:
            self.own[self._proc.pid] = "collector"  # as hostinfo.own_role names a jitterscope.collector module
        self._reaper = weakref.finalize(self, _reap, self._proc)
        return self._proc

    def _send(self, message: dict) -> None:
        self._proc.stdin.write(json.dumps(message).encode() + b"\n")

    def _reply(self, proc: subprocess.Popen) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("user symbol helper did not answer")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("user symbol helper exited")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def _stop(self, failed: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self.restarts += failed
        self._reaper()


def _reap(proc: subprocess.Popen) -> None:
    """End a helper: its pipes closed (it exits at end of input), killed if
    it does not within 2 s. Also run when its UserSymbolsHelper is collected
    unclosed, so no helper outlives its owner."""
    _running_helpers.discard(proc.pid)
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stack_id(comm: str, kernel: list[str], user: list[str]) -> int:
    """The stable id of a symbolized stack: 63 bits of a hash (the records'
    U64 stops at 2**63 - 1, what every JSON reader takes), never 0 (none)."""
    text = "\0".join([comm, *kernel, "\1", *user]).encode()
    return (int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1) or 1


class StackTable:
    """Stacks as ids, each distinct one published once through
    ``publish(stack_id, pid, comm, kernel, user)``."""

    def __init__(self, publish: Callable[[int, int, str, list[str], list[str]], None],
                 symbolizer: Symbolizer | None = None):
        self._publish = publish
        self.symbolizer = symbolizer or Symbolizer()
        self._published = _Lru(MAX_PUBLISHED)

    def resolve(self, pid: int, comm: str, kernel_addrs, user_addrs) -> int:
        """The stack id of these addresses (innermost first) of ``pid``,
        published if new; 0 when the kernel took neither."""
        if not kernel_addrs and not user_addrs:
            return 0
        kernel = self.symbolizer.kernel(kernel_addrs)
        user = self.symbolizer.user(user_addrs, pid) if user_addrs else []
        ident = stack_id(comm, kernel, user)
        if ident not in self._published:
            self._publish(ident, pid, comm, kernel, user)
        self._published.put(ident, True)
        return ident

    def forget(self, pids: set[int]) -> None:
        self.symbolizer.forget(pids)

    def close(self) -> None:
        self.symbolizer.close()


def _user_frame(cache, addr: int) -> str:
    name, _offset, module = cache.resolve(addr, True)
    if name:
        return name.decode(errors="replace")
    if module:  # no symbol (stripped), but the file is known; "[vdso]" is bracketed already
        base = os.path.basename(module.decode(errors="replace"))
        return base if base.startswith("[") else f"[{base}]"
    return UNKNOWN


def serve(requests: BinaryIO, replies: BinaryIO, max_processes: int = MAX_PROCESSES) -> None:
    """The helper's loop: a BCC symbol cache per process (bounded, freed on
    ``forget`` and eviction), one reply line per resolve request."""
    from bcc import SymbolCache
    from bcc.libbcc import lib

    def free(pid: int, cache) -> None:
        lib.bcc_free_symcache(cache.cache, pid)

    caches = _Lru(max_processes, free)
    for line in requests:
        message = json.loads(line)
        if "forget" in message:
            for pid in message["forget"]:
                if pid in caches:
                    free(pid, caches.pop(pid))
            continue
        pid = int(message["pid"])
        cache = caches.get(pid) or SymbolCache(pid)
        caches.put(pid, cache)
        replies.write(json.dumps([_user_frame(cache, int(a)) for a in message["addrs"]]).encode() + b"\n")
        replies.flush()


def _main() -> None:
    """Move the pipe ends to high fd numbers (libbcc's stray close takes
    stale small ones), put /dev/null where they were, and serve."""
    soft = os.sysconf("SC_OPEN_MAX")
    high = max(3, min(1000, soft - 16))
    requests = os.fdopen(fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, high), "rb")
    replies = os.fdopen(fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, high), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    serve(requests, replies)


if __name__ == "__main__":
    _main()
