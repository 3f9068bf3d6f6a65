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

libbcc opens a process's mapped files and ``/tmp/perf-PID.map`` by paths
that process controls, with a plain blocking open() and no size limit: a
FIFO there stopped the helper (and the collector waiting on it), a sparse
64 GB perf map grew it without bound (issue 40, item 3). So the helper first
checks them (:func:`refusal`) and refuses a process whose files are not
plain ones of a sane size; a process it refuses, or that still makes it time
out or die (a file swapped in after the check), is not asked about again
until it exits: one such process costs the collector one wait, not one per
event (``UserSymbolsHelper.refused``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import resource
import select
import subprocess
import sys
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO, Callable

from jitterscope.common import untrusted
from jitterscope.common.logs import fields

log = logging.getLogger("jitterscope.collector.stacks")

MAX_PROCESSES = 64          # user symbol tables kept (ELF symbols of a process: MBs)
MAX_FRAMES_PER_PROCESS = 8192
MAX_PUBLISHED = 65536       # stack ids already sent
UNKNOWN = "[unknown]"
MAX_PERF_MAP = 256 << 20    # a JIT's perf map of a long-running process: tens of MB
MAX_MODULE = 8 << 30        # a mapped ELF libbcc reads symbols from (CUDA libraries: ~1-2 GB)
MAX_REFUSED = 4096          # processes not asked about again, remembered until they exit
HELPER_DATA_LIMIT = 4 << 30  # the helper's RLIMIT_DATA: a file swapped in after the check ends it, not the host


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
        self._processes = _Lru(max_processes, lambda pid, _names: self.helper.forget({pid}, exited=False))
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
        refused = pids & self.helper.refused.keys()  # also those whose names were evicted since
        if gone or refused:
            self.helper.forget(gone | refused)

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
        # pid -> why its frames are not asked for (module docstring); counted in ``refusals``
        self.refused: _Lru = _Lru(MAX_REFUSED)
        self.refusals = 0
        self._proc: subprocess.Popen | None = None
        self._pending = b""  # what the helper wrote past the last full line

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def resolve(self, pid: int, addrs: list[int]) -> list[str] | None:
        """The names of ``addrs`` in process ``pid``; None if the process is
        refused (its files are not safe to read, or asking about it made the
        helper time out or fail twice: it is then not asked about again
        until ``forget``). A helper found dead is replaced once, at once."""
        if pid in self.refused:
            return None
        why = "the helper failed twice"
        for _attempt in range(2):
            try:
                proc = self._proc or self._start()
                self._send({"pid": pid, "addrs": addrs})
                names = json.loads(self._reply(proc))
                if isinstance(names, list) and len(names) == len(addrs):
                    return [str(n) for n in names]
                if isinstance(names, dict) and "refused" in names:
                    self._refuse(pid, str(names["refused"]))
                    return None
            except TimeoutError:
                # a file of this process blocked libbcc (or its symbols take too long): once is enough
                self._stop(failed=True)
                why = f"no answer within {self.timeout_s:g} s"
                break
            except (OSError, ValueError, EOFError):
                pass
            self._stop(failed=True)
        self._refuse(pid, why)
        return None

    def _refuse(self, pid: int, why: str) -> None:
        self.refused.put(pid, why)
        self.refusals += 1
        log.warning("user frames of a process not resolved", extra=fields(pid=pid, reason=why))

    def start(self) -> None:
        """Start the helper now rather than on first use (it answers once
        it has imported BCC; nothing waits for that here)."""
        if self._proc is None:
            self._start()

    def forget(self, pids: set[int], exited: bool = True) -> None:
        """Free the helper's symbols of ``pids``; ``exited``: they have
        exited, so their refusals go too (the number may be another
        process's next), not only evicted from the collector's memory."""
        for pid in pids if exited else ():
            self.refused.pop(pid, None)
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


# what libbcc 0.26 takes for no file (bcc_proc.c, bcc_mapping_is_file_backed)
_NOT_FILES = ("//anon", "/dev/zero", "/anon_hugepage", "[stack", "/SYSV", "[heap]", "[vsyscall]")


def refusal(pid: int, proc: Path = Path("/proc")) -> str | None:
    """Why libbcc must not be let read process ``pid``'s files, or None.

    libbcc 0.26 (bcc_proc.c, bcc_syms.cc, bcc_perf_map.c) opens, blocking
    and following links: each executable mapping's path as /proc/PID/maps
    spells it (a newline in a name reads "\\012", so that text may name a
    FIFO the process planted), through the process's root; then its perf
    map, <its root>/tmp/perf-<its own pid>.map, else /tmp/perf-<pid>.map,
    which it reads to the end. Each that exists must be a regular file of a
    sane size, and a perf map the process's or root's."""
    base = proc / str(pid)
    try:
        status = (base / "status").read_text()
        maps = (base / "maps").read_text(errors="surrogateescape")
        root = os.readlink(base / "root")
    except OSError:
        return None  # exited, or not ours to read: libbcc opens nothing of it either
    fields_ = {k: v.split() for k, _, v in (line.partition(":") for line in status.splitlines())}
    owners = {0, *map(int, fields_.get("Uid", []))}
    nstgid = (fields_.get("NStgid") or fields_.get("Tgid") or [str(pid)])[-1]
    for name in dict.fromkeys(_module_names(maps)):
        path = base / "root" / name.lstrip("/")
        try:
            untrusted.check(os.stat(path), str(path), max_size=MAX_MODULE)  # stat follows as libbcc will, opens nothing
        except FileNotFoundError:
            continue  # libbcc cannot open it either
        except OSError as e:
            return f"mapped file {e}"
    inner = (root if root != "/" else "") + f"/tmp/perf-{nstgid}.map"
    for path in (base / "root" / inner.lstrip("/"), Path(f"/tmp/perf-{pid}.map")):
        try:
            untrusted.stat_file(path, max_size=MAX_PERF_MAP, owners=owners)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"perf map {e}"
    return None


def _module_names(maps: str):
    """The names libbcc takes for files in ``maps``: executable mappings'."""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[1][2:3] == "x" and not parts[5].startswith(_NOT_FILES) \
                and "/memfd:" not in parts[5]:
            yield parts[5]


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
        cache = caches.get(pid)
        why = refusal(pid) if cache is None else None
        if why:
            reply: object = {"refused": why}
        else:
            cache = cache or SymbolCache(pid)
            caches.put(pid, cache)
            reply = [_user_frame(cache, int(a)) for a in message["addrs"]]
        replies.write(json.dumps(reply).encode() + b"\n")
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
    # a file swapped in between refusal()'s check and libbcc's read (a sparse perf map: getline()
    # grows one buffer to its size) makes an allocation fail here, not the host's memory run out
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = HELPER_DATA_LIMIT if hard == resource.RLIM_INFINITY else min(HELPER_DATA_LIMIT, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    serve(requests, replies)


if __name__ == "__main__":
    _main()
