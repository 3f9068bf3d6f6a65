# SPDX-License-Identifier: Apache-2.0
"""Loading BCC programs, and the checks that say why one cannot load.

The same checks back `jitterscope doctor` and the collector's start-up, so a
user sees one message with the fix, not a clang error.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from jitterscope.common import errors

TRACEFS_ROOTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    error: type[errors.JitterscopeError] = errors.JitterscopeError
    #: passed, but over a target (self-cost): shown as "warn" with its fix, never fails `doctor`
    warn: bool = False


def check_privileges() -> Check:
    if os.geteuid() == 0:
        return Check("privileges", True, "running as root")
    caps = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
    cap_bpf, cap_perfmon, cap_sys_admin = 1 << 39, 1 << 38, 1 << 21
    if caps & cap_sys_admin or (caps & cap_bpf and caps & cap_perfmon):
        return Check("privileges", True, "has CAP_BPF+CAP_PERFMON")
    return Check(
        "privileges", False, "not root and lacks CAP_BPF/CAP_PERFMON",
        "run as root (sudo jitterscope ...) or grant cap_bpf,cap_perfmon,cap_sys_resource",
        errors.NotPrivileged,
    )


def _exists(path: Path) -> bool | None:
    """Whether ``path`` exists; None when this user may not look (tracefs is
    root-only: check_privileges then says what to do, not a traceback)."""
    try:
        return path.exists()
    except PermissionError:
        return None


def tracefs_root() -> Path | None:
    for root in TRACEFS_ROOTS:
        if _exists(root / "events/sched/sched_switch/format") is not False:
            return root
    return None


def check_tracefs() -> Check:
    root = tracefs_root()
    if root:
        return Check("tracefs", True, f"sched tracepoints at {root}")
    return Check(
        "tracefs", False, "tracefs is not mounted (no events/sched/sched_switch)",
        "mount -t tracefs tracefs /sys/kernel/tracing   (or: make setup)",
        errors.TracefsMissing,
    )


def check_headers() -> Check:
    build = Path("/lib/modules") / platform.release() / "build"
    if (build / "include").is_dir():
        target = build.resolve()
        generic = platform.release() not in target.name
        note = f" (generic {target.name}: tracepoint-argument programs only)" if generic else ""
        return Check("kernel headers", True, f"{build} -> {target}{note}")
    return Check(
        "kernel headers", False, f"no kernel headers at {build}",
        f"apt-get install linux-headers-{platform.release()}   (or: make setup, which links generic headers)",
        errors.KernelHeadersMissing,
    )


def check_bcc() -> Check:
    try:
        import bcc  # noqa: F401
    except ImportError:
        return Check(
            "bcc", False, "the bcc Python module is not importable",
            "apt-get install python3-bpfcc and link it into the venv (make setup); "
            "PyPI's 'bcc' is an unrelated package",
            errors.BccMissing,
        )
    return Check("bcc", True, f"bcc from {Path(bcc.__file__).parent}")


def check_kprobes() -> Check:
    root = tracefs_root()
    has = _exists(root / "kprobe_events") if root else False
    detail = {True: "available", False: "not compiled in (tracepoint paths are used)",
              None: "cannot tell without root (tracepoint paths are used)"}[has]
    return Check("kprobes", True, detail)


def preflight() -> list[Check]:
    return [check_privileges(), check_tracefs(), check_headers(), check_bcc(), check_kprobes()]


def require_loadable() -> None:
    """Raise the first failing check as its typed error."""
    for check in preflight():
        if not check.ok:
            raise check.error(f"{check.detail}: {check.fix}")


def bpf_source(name: str) -> Path:
    return Path(str(resources.files("jitterscope.bpf").joinpath(name)))


def spliced_source(source: Path) -> str:
    """The program's text with each ``#include "*.bpf.inc"`` line replaced by
    that file's text: BCC rewrites map calls only in the main source, so
    shared code that touches maps is spliced in rather than included."""
    return re.sub(r'^#include "([\w.]+\.bpf\.inc)".*$',
                  lambda m: (source.parent / m[1]).read_text(), source.read_text(), flags=re.M)


def load(source_name: str, defines: dict[str, int] | None = None):
    """Compile and load ``bpf/<source_name>`` with BCC (tracepoints auto-attach).
    ``defines`` become -D flags (the programs' MAX_* map sizes)."""
    require_loadable()
    from bcc import BPF

    source = bpf_source(source_name)
    flags = [f"-I{source.parent}"] + [f"-D{name}={int(value)}" for name, value in (defines or {}).items()]
    try:
        return BPF(text=spliced_source(source).encode(), cflags=flags)
    except Exception as exc:  # BCC raises bare Exception on compile/load errors
        raise errors.ProbeLoadFailed(
            f"could not load {source_name}: {exc}; run 'jitterscope doctor' to check the host"
        ) from exc


def release_compiler_memory() -> None:
    """After the last compile: hand back what BCC's clang/LLVM left resident
    -- its code pages (bcc's own bcc_free_memory) and the heap glibc kept
    after the compiler freed it (malloc_trim). A later compile faults them
    back in. Best effort: neither is needed for the probes to run."""
    import ctypes
    import ctypes.util

    try:
        from bcc.libbcc import lib

        lib.bcc_free_memory()
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (ImportError, AttributeError, OSError):
        pass


def map_items(table) -> list:
    """Every (key, value) of a BPF hash map, read in batches
    (BPF_MAP_LOOKUP_BATCH, Linux 5.6+) where the kernel has them: 4,000
    entries in 2 ms instead of 19 ms key by key (``items()``: a syscall and
    several ctypes calls each), the bulk of the collector's 60 ms bursts
    every histogram interval (bench/RESULTS.md, issue 39). Simple-typed keys
    and values come back as the table's Key and Leaf, as ``items()`` gives them."""
    try:
        pairs = list(table.items_lookup_batch())
    except Exception:  # an older kernel or map type: key by key
        return list(table.items())
    return [(table.Key(k) if isinstance(k, int) else k, table.Leaf(v) if isinstance(v, int) else v)
            for k, v in pairs]


def delete_keys(table, keys: list) -> None:
    """Delete ``keys`` from a BPF hash map in one batch where the kernel
    can; key by key (one already gone is no error) where it cannot."""
    if not keys:
        return
    try:
        table.items_delete_batch((table.Key * len(keys))(*keys))
        return
    except Exception:  # a key already gone stops the batch: the rest one by one
        pass
    for key in keys:
        try:
            del table[key]
        except KeyError:
            pass


def c_string(raw: bytes) -> str:
    """A kernel char[] (NUL-padded, e.g. a comm) as text; bad bytes kept visible."""
    return raw.split(b"\0", 1)[0].decode(errors="replace")


DROP_RINGBUF, DROP_MAP_FULL = 0, 1  # slots of every program's `drops` array (bpf/drops.h)
# bpf/common.h: a kernel task name's size (NUL included), and the node of a
# page or CPU outside the ranges and maps the collector gave (NUMA nodes are
# < UNKNOWN_NODE). tests/unit/collector/probes/test_probe_decoding.py checks they match.
TASK_COMM_LEN = 16
UNKNOWN_NODE = 255


class BccProbe:
    """A loaded BPF program: its ring buffer, its per-CPU loss counters
    (bpf/drops.h), clean-up, and use as a context manager. Subclasses name
    their ``source`` in bpf/; ``defines`` overrides its compile-time map
    sizes (``{"MAX_HIST_KEYS": 4}``: a test can fill a map)."""

    source: str
    defines: dict[str, int] = {}

    def __init__(self):
        self._bpf = load(self.source, self.defines)
        # BCC attached every TRACEPOINT_PROBE at load: tracepoint -> its program
        self._tracepoints = {tp: b"tracepoint__" + tp.replace(b":", b"__") for tp in self._bpf.tracepoint_fds}
        self.targets_refused = 0  # processes the target map had no room for (each counted once while refused)
        self._refused: set[int] = set()

    def set_entries(self, name: bytes, wanted: dict[int, int]) -> set[int]:
        """Make map ``name`` hold exactly ``wanted`` (pid -> value), the ones
        gone deleted first to free room; what does not fit is refused,
        counted and returned, never raised: a full target map (span senders
        choose how many processes ask to be watched) must not close the
        signal, and the processes already in it stay watched."""
        table = self._bpf[name]
        current = {k.value: v.value for k, v in table.items()}
        for pid in current.keys() - wanted.keys():
            try:
                del table[table.Key(pid)]
            except KeyError:
                pass
        refused = set()
        for pid, value in wanted.items():
            if current.get(pid) != value:
                try:
                    table[table.Key(pid)] = table.Leaf(value)
                except Exception:  # BCC raises a bare Exception (E2BIG: the map is full)
                    refused.add(pid)
        self.targets_refused += len(refused - self._refused)
        self._refused = refused
        return refused

    @staticmethod
    def decode(raw):
        """A record of the ``events`` ring buffer (BCC's ctypes view) as the
        probe's event; probes that send events one by one give it."""
        raise NotImplementedError

    def open(self, on_event) -> None:
        """Call ``on_event(decode(record))`` for each record of the
        ``events`` ring buffer, from poll()."""
        table = self._bpf[b"events"]
        decode = self.decode

        def callback(_ctx, data, _size):
            on_event(decode(table.event(data)))

        table.open_ring_buffer(callback)

    def poll(self, timeout_ms: int) -> None:
        """Read what the ring buffers hold, waiting up to ``timeout_ms`` for a
        wakeup. A probe may wake the reader only once a batch is waiting
        (bpf/runq.bpf.c): what it holds is read when the wait times out."""
        self._bpf.ring_buffer_poll(timeout_ms)
        self._bpf.ring_buffer_consume()

    def _lost(self, slot: int) -> int:
        """A loss counter, summed over CPUs; the last value read if the
        kernel refuses the read (a counter for /metrics must never stop
        the collector: one such refusal, under a profiler attached to it,
        ended a collector here)."""
        import ctypes

        last = self.__dict__.setdefault("_last_lost", {})
        try:
            last[slot] = sum(self._bpf[b"drops"][ctypes.c_int(slot)])
        except (KeyError, OSError) as exc:
            if not self.__dict__.get("_lost_unreadable"):
                self._lost_unreadable = True
                logging.getLogger(__name__).warning(
                    "BPF loss counters unreadable; reporting their last values",
                    extra={"fields": {"source": self.source, "error": repr(exc)}})
        return last.get(slot, 0)

    def drops(self) -> int:
        """Events lost in the kernel because the ring buffer was full."""
        return self._lost(DROP_RINGBUF)

    def map_full_drops(self) -> int:
        """In-kernel map updates that failed (a bounded map full): state the
        kernel could not keep -- a wait not timed, a count not made."""
        return self._lost(DROP_MAP_FULL)

    def attach_tracepoints(self, on: bool) -> bool:
        """Attach (``on``) or detach the program's tracepoints; whether any
        was attached before. For probes with nothing to watch at times: their
        programs would still run on every hit, for nothing."""
        attached = set(self._bpf.tracepoint_fds)
        for tp, fn in self._tracepoints.items():
            if on and tp not in attached:
                self._bpf.attach_tracepoint(tp=tp, fn_name=fn)
            elif not on and tp in attached:
                self._bpf.detach_tracepoint(tp)
        return bool(attached)

    @property
    def attached(self) -> bool:
        return bool(self._bpf.tracepoint_fds)

    def close(self) -> None:
        self._bpf.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def program_fds(self) -> dict[str, int]:
        """{function name: program fd} of the loaded programs (auto-attached
        tracepoints included): full names for the self-cost figures."""
        return {name.decode(errors="replace"): fn.fd for name, fn in self._bpf.funcs.items()}


class Log2Histograms:
    """A kernel map of cumulative per-process log2 counters ({pid, slot} ->
    count), read as deltas since the previous read: the kernel never resets
    them, so a read cannot race an increment."""

    def __init__(self, table):
        self._table = table
        self._seen: dict[tuple[int, int], int] = {}

    def read(self) -> dict[int, dict[int, int]]:
        """pid -> {slot: new counts since the last read}."""
        deltas: dict[int, dict[int, int]] = {}
        alive: dict[tuple[int, int], int] = {}
        for key, value in map_items(self._table):
            ident = (key.pid, key.slot)
            alive[ident] = value.value
            delta = value.value - self._seen.get(ident, 0)
            if delta > 0:
                deltas.setdefault(key.pid, {})[key.slot] = delta
        self._seen = alive
        return deltas

    def forget(self, pids: set[int]) -> None:
        """Drop the counters of processes that have exited (the map is
        bounded): the entries the last read saw (an exited process adds none
        after it), in one batch rather than a walk of the whole map key by key."""
        gone = [ident for ident in self._seen if ident[0] in pids]
        delete_keys(self._table, [self._table.Key(pid, slot) for pid, slot in gone])
        for ident in gone:
            del self._seen[ident]


class LatencyProbe(BccProbe):
    """A probe whose program sends tail events one by one through its
    ``events`` ring buffer and counts every latency in per-process log2
    histograms (its ``hist`` map): the run queue and GPU driver calls.
    Subclasses give ``decode`` (raw ring-buffer struct -> event)."""

    def __init__(self):
        super().__init__()
        self.histograms = Log2Histograms(self._bpf[b"hist"])

    def read_histograms(self) -> dict[int, dict[int, int]]:
        """pid -> {slot: new latencies since the last read}; slot = log2(latency in us)."""
        return self.histograms.read()

    def forget_histograms(self, pids: set[int]) -> None:
        """Drop kernel counters of processes that have exited (bounded map)."""
        self.histograms.forget(pids)
