# SPDX-License-Identifier: Apache-2.0
"""The "blocked" signal and its loader for bpf/blocked.bpf.c: when a thread
of a serving group was blocked (asleep off the CPU, not preempted) for at
least ``blocked_threshold_ms``, what it was blocked on (the GIL, memory, I/O,
any other sleep) and the task that woke it.

Only the serving groups' processes are watched (`set_targets`' thresholds:
the processes that send request spans and their groups), never jitterscope's
own. For each one that is a CPython process with a findable ``_PyRuntime``
(collector/pyruntime.py), a uprobe/uretprobe pair on its libc's
``pthread_cond_timedwait`` tells GIL waits from other sleeps; for the others
``gil_status`` keeps the reason they are not measured.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Iterable, NamedTuple

from jitterscope.collector import pyruntime
from jitterscope.collector.probes import base
from jitterscope.collector.probes.blockio import MINOR_BITS, device_name
from jitterscope.collector.probes.interface import BccSignal, ProbeContext
from jitterscope.common.logs import fields
from jitterscope.schemas import events

log = logging.getLogger("jitterscope.collector.blocked")

GIL_WAIT = b"pthread_cond_timedwait"
EXITED = "not measurable: exited"


class RawBlocked(NamedTuple):  # a tuple: one per ring-buffer record, built 4x faster than a frozen dataclass
    """A ring-buffer record, monotonic time, as the kernel wrote it."""

    ts_ns: int          # when the thread was woken (a reclaim: when it ended)
    blocked_ns: int
    pid: int            # tgid of the blocked thread
    tid: int
    comm: str           # the blocked thread's name
    kind: str           # one of events.BLOCKED_KINDS
    state: int          # 1 = S, 2 = D, 0 = a whole reclaim (on-CPU time included)
    waker_pid: int      # 0: no task (its own timer: waker_tid is its tid; an interrupt on an idle CPU)
    waker_tid: int
    waker_comm: str
    dev: int = 0        # io: the kernel dev_t of the device it waited on (0: none seen)


def decode_event(e) -> RawBlocked:
    """A ``struct blocked_event`` (bpf/blocked.h) as BCC's ctypes view gives it."""
    kind = events.BLOCKED_KINDS[e.kind] if e.kind < len(events.BLOCKED_KINDS) else "sleep"
    return RawBlocked(e.ts_ns, e.blocked_ns, e.pid, e.tid, base.c_string(bytes(e.comm)), kind, e.state,
                      e.waker_pid, e.waker_tid, base.c_string(bytes(e.waker_comm)), e.dev)


_wait_addresses: dict[tuple[int, int, int], tuple[int, ...]] = {}


def gil_wait_addresses(libc: str, st: os.stat_result | None = None) -> tuple[int, ...]:
    """Where ``pthread_cond_timedwait`` is in this libc (``st``: its fstat,
    for a libc the caller opened; a trusted path is stat'ed here), as uprobe
    offsets.

    glibc exports two: the default pthread_cond_timedwait@@GLIBC_2.3.2 that
    every program linked since 2002 calls, and an old compat copy
    (@GLIBC_2.2.5) at another address, which BCC's name look-up picks. The
    default version is taken; a libc without symbol versions gives its one."""
    st = st or os.stat(libc)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if key not in _wait_addresses:
        from bcc import BPF

        found = BPF.get_user_functions_and_addresses(libc.encode(), rb"^pthread_cond_timedwait(@@?.*)?$")
        default = sorted({addr for name, addr in found if b"@@" in name})
        plain = sorted({addr for name, addr in found if name == GIL_WAIT})
        if len(_wait_addresses) > 16:
            _wait_addresses.clear()
        _wait_addresses[key] = tuple(default or plain)
    return _wait_addresses[key]


def has_tracepoint(category: str, event: str) -> bool:
    root = base.tracefs_root()
    return bool(root) and (root / "events" / category / event / "format").exists()


class BlockedProbe(base.BccProbe):
    source = "blocked.bpf.c"
    decode = staticmethod(decode_event)

    def __init__(self, threshold_ns: int, watched: Iterable[int] = ()):
        """``threshold_ns``: blocks at least this long become events (the
        collector's default is 1 ms). ``watched``: the tgids to follow."""
        if has_tracepoint("filemap", "mm_filemap_fault"):  # recent kernels; else fault sleeps are io
            self.defines = {**self.defines, "HAVE_FILEMAP_FAULT": 1}
        super().__init__()
        self.threshold_ns = max(1, threshold_ns)  # 0 means "not configured" to the kernel
        self._uprobes: dict[int, list[bytes]] = {}  # pid -> its uprobe event names
        self.set_watched(watched)
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        leaf.threshold_ns = self.threshold_ns
        config[ctypes.c_int(0)] = leaf

    def set_watched(self, pids: Iterable[int]) -> set[int]:
        """Follow the threads of exactly these processes from now on; the
        ones the map had no room for (refused and counted)."""
        wanted = {int(pid) for pid in pids}
        current = self.watched()
        self._drop_blocked(current - wanted)
        refused = self.set_entries(b"watched", dict.fromkeys(wanted, 1))
        self._attach(bool(wanted))
        return refused

    def _attach(self, on: bool) -> None:
        """The tracepoints attached only while a process is watched: with
        none, every context switch and wakeup on the host would still run
        the programs to find nothing (313 ns of BPF per switch measured, the
        idle host's largest share after the run-queue probe's)."""
        if self.attach_tracepoints(on) and not on:  # a block or fault begun before has no end now: no stale start later
            for table in (b"in_gil", b"in_reclaim", b"fault_at", b"io_dev", b"blocked_at", b"gil_pending",
                          b"short_runs", b"timer_woke", b"in_timer"):
                self._bpf[table].clear()

    def watched(self) -> set[int]:
        return {k.value for k in self._bpf[b"watched"].keys()}

    def watch_gil(self, site: pyruntime.GilSite) -> None:
        """Tell GIL waits in process ``site.pid`` apart: its _PyRuntime range
        into ``gil`` and a uprobe/uretprobe pair on its libc's
        pthread_cond_timedwait, filtered to its threads. Raises (BCC's bare
        Exception, or OSError) when the process or its libc has gone, or its
        libc is not a file to read (common/untrusted.py); nothing is left
        attached then.

        libbcc reads, and the kernel resolves, ``/proc/self/fd/N`` of the libc
        opened and checked here, never a path the target controls: a FIFO
        there blocked libbcc's open() in the collector's main thread."""
        self.unwatch_gil(site.pid)
        gil = self._bpf[b"gil"]
        leaf = gil.Leaf()
        leaf.lo, leaf.hi = site.runtime_lo, site.runtime_hi
        gil[gil.Key(site.pid)] = leaf
        names: list[bytes] = []
        self._uprobes[site.pid] = names
        try:
            with site.open_libc() as libc:
                self._attach_gil(site, f"/proc/self/fd/{libc.fileno()}", os.fstat(libc.fileno()), names)
        except BaseException:
            self.unwatch_gil(site.pid)
            raise

    def _attach_gil(self, site: pyruntime.GilSite, libc: str, st: os.stat_result, names: list[bytes]) -> None:
        addresses = gil_wait_addresses(libc, st)
        if not addresses:
            raise OSError(f"no pthread_cond_timedwait in {site.libc}")
        for addr in addresses:
            for attach, fn in ((self._bpf.attach_uprobe, b"gil_wait_enter"),
                               (self._bpf.attach_uretprobe, b"gil_wait_return")):
                before = set(self._bpf.uprobe_fds)
                attach(name=libc.encode(), addr=addr, fn_name=fn, pid=site.pid)
                names.extend(set(self._bpf.uprobe_fds) - before)

    def unwatch_gil(self, pid: int) -> None:
        """Detach process ``pid``'s uprobes and forget its range (it may
        have exited: detaching needs only the event names)."""
        for name in self._uprobes.pop(pid, []):
            try:
                self._bpf.detach_uprobe_event(name)
            except Exception:  # already gone
                pass
        self._delete(self._bpf[b"gil"], pid)

    def gil_watched(self) -> set[int]:
        """The processes with uprobes attached."""
        return set(self._uprobes)

    def forget(self, pids: set[int]) -> None:
        """Processes that have exited or left the targets: their uprobes,
        map entries and blocks in progress."""
        watched = self._bpf[b"watched"]
        for pid in pids:
            self.unwatch_gil(pid)
            self._delete(watched, pid)
        self._drop_blocked(pids)

    def _drop_blocked(self, pids: set[int]) -> None:
        if not pids:
            return
        blocked = self._bpf[b"blocked_at"]
        for key, value in list(blocked.items()):
            if value.tgid in pids:
                self._delete(blocked, key.value)

    @staticmethod
    def _delete(table, key: int) -> None:
        try:
            del table[table.Key(key)]
        except KeyError:
            pass

    def close(self) -> None:
        for pid in list(self._uprobes):
            self.unwatch_gil(pid)
        super().close()


class BlockedSignal(BccSignal):
    """Blocks of the serving groups' threads (setting ``blocked_threshold_ms``)."""

    name = "blocked"
    publishes = (events.BlockedWait,)

    def __init__(self):
        super().__init__()
        self.probe: BlockedProbe | None = None
        self._watched: set[int] = set()
        # pid -> "measured: CPython 3.11 (...)" or "not measurable: <why>", for logs and tests
        self.gil_status: dict[int, str] = {}
        self._devices: dict[int, str] = {}  # kernel dev_t -> block device name

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        self.probe = BlockedProbe(int(context.settings.blocked_threshold_ms * 1_000_000))
        self.probe.open(self.on_event)
        self.set_targets(context.targets, context.thresholds)

    def set_targets(self, targets: set[int] | None, thresholds: dict[int, int]) -> None:
        """Watch the serving groups' members (the processes with a threshold
        of their own), jitterscope's own processes never."""
        if not self.probe:
            return
        wanted = {pid for pid in thresholds if pid not in self.ctx.own}
        left = self._watched - wanted
        if left:
            self.probe.forget(left)
            for pid in left:
                self.gil_status.pop(pid, None)
        wanted -= self.probe.set_watched(wanted)  # no uprobes for what the map had no room for
        for pid in sorted(wanted - self._watched):
            self._watch_gil(pid)
        self._watched = wanted

    def _watch_gil(self, pid: int) -> None:
        site = pyruntime.locate(pid, self.ctx.proc)
        if isinstance(site, pyruntime.NotMeasurable):
            status = f"not measurable: {site.reason}"
        else:
            try:
                self.probe.watch_gil(site)
                status = f"measured: CPython {site.version} ({site.interpreter})"
            except Exception as exc:  # BCC raises bare Exception; the process may have exited
                gone = not (Path(self.ctx.proc) / str(pid)).exists()
                status = EXITED if gone else f"not measurable: uprobe on {site.libc}: {exc}"
        self.gil_status[pid] = status
        log.info("GIL waits %s", "measured" if status.startswith("measured") else "not measured",
                 extra=fields(pid=pid, status=status))

    def on_event(self, raw: RawBlocked) -> None:
        self.events_read += 1
        ctx = self.ctx
        waker_comm, _ = events.suspect_name(raw.waker_comm, ctx.own.get(raw.waker_pid) if raw.waker_pid else None)
        ctx.describe_process(raw.pid)
        ctx.describe_process(raw.waker_pid)  # 0 (a timer, an interrupt on an idle CPU) is skipped
        ctx.publish(ctx.event(
            events.BlockedWait, raw.ts_ns, pid=raw.pid, tid=raw.tid, comm=raw.comm, kind=raw.kind,
            blocked_ns=raw.blocked_ns, waker_pid=raw.waker_pid, waker_tid=raw.waker_tid, waker_comm=waker_comm,
            device=self._device(raw.dev)))

    def _device(self, dev: int) -> str:
        """A kernel dev_t's block device name (loop0, nvme0n1), "" for 0 or
        one gone; names found are kept (a device's number is its own while
        it exists)."""
        if not dev:
            return ""
        name = self._devices.get(dev)
        if name is None:
            name = device_name(dev >> MINOR_BITS, dev & ((1 << MINOR_BITS) - 1))
            if name:
                self._devices[dev] = name
        return name

    def poll(self, timeout_ms: int = 0) -> None:
        if self.probe:
            self.probe.poll(timeout_ms)

    def periodic(self, interval_ns: int, now_ns: int) -> list[events.Record]:
        return []

    def forget(self, pids: set[int]) -> None:
        if not self.probe:
            return
        self.probe.forget(pids)
        self._watched -= pids
        for pid in pids:
            self.gil_status.pop(pid, None)
