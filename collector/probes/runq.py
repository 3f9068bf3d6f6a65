# SPDX-License-Identifier: Apache-2.0
"""The "runq" signal (always on) and its loader for bpf/runq.bpf.c:
run-queue latency with the first suspect, and the stacks at alarm (the
victim's where it was preempted, the suspect's where it gave up the CPU;
collector/stacks.py turns them into StackTrace records).

Tail waits arrive one by one through the ring buffer; every wait is in the
per-process log2 histogram, which `read_histograms` turns into deltas since
the previous read (the kernel counters stay cumulative, so nothing is lost to a
read/clear race).
"""

from __future__ import annotations

import ctypes
import time
from typing import NamedTuple

from jitterscope.collector import hostinfo
from jitterscope.collector.publish import urgent_wait_ns
from jitterscope.collector.stacks import StackTable, Symbolizer, UserSymbolsHelper
from jitterscope.collector.probes import base
from jitterscope.collector.probes.interface import LatencySignal, ProbeContext
from jitterscope.schemas import events


class RawRunqEvent(NamedTuple):  # a tuple: one per ring-buffer record, built 4x faster than a frozen dataclass
    """A ring-buffer record, monotonic time, as the kernel wrote it."""

    ts_ns: int
    wait_ns: int
    pid: int
    tid: int
    cpu: int
    suspect_pid: int
    suspect_tid: int
    comm: str
    suspect_comm: str
    # stacks, innermost first: where the waiter was preempted, and the
    # suspect's when it gave up the CPU (empty: none taken)
    victim_kernel: tuple[int, ...] = ()
    victim_user: tuple[int, ...] = ()
    suspect_kernel: tuple[int, ...] = ()
    suspect_user: tuple[int, ...] = ()
    waits: int = 1  # > 1: a serving thread's short waits, summed (bpf/runq.h struct short_waits)


def _addrs(frames, size: int) -> tuple[int, ...]:
    """A bpf_get_stack buffer of ``size`` bytes (< 0: none) as addresses."""
    return tuple(frames[:max(0, size) // 8])


def decode_event(e) -> RawRunqEvent:
    """A ``struct runq_event`` (bpf/runq.h) as BCC's ctypes view gives it."""
    return RawRunqEvent(e.ts_ns, e.wait_ns, e.pid, e.tid, e.cpu, e.suspect_pid, e.suspect_tid,
                        base.c_string(bytes(e.comm)), base.c_string(bytes(e.suspect_comm)),
                        _addrs(e.victim_kernel, e.victim_kernel_bytes), _addrs(e.victim_user, e.victim_user_bytes),
                        _addrs(e.suspect_kernel, e.suspect_kernel_bytes),
                        _addrs(e.suspect_user, e.suspect_user_bytes), e.waits)


class RunqProbe(base.LatencyProbe):
    source = "runq.bpf.c"
    decode = staticmethod(decode_event)

    def __init__(self, threshold_ns: int, target_pids: set[int] | None = None,
                 thresholds: dict[int, int] | None = None, stacks: bool = True, wake_ns: int = 0,
                 stacks_from_ns: int = 0):
        """``target_pids`` None watches every process; ``thresholds`` gives
        some processes their own event threshold (ns); ``stacks`` False
        takes no stacks, else for waits of ``stacks_from_ns`` or more (0:
        every event's); a wait of ``wake_ns`` or more (0: none) wakes the
        reader at once rather than at its next poll."""
        super().__init__()
        self.wake_us, self.stacks_from_us = wake_ns // 1000, stacks_from_ns // 1000
        self.threshold_ns = max(1, threshold_ns)  # 0 means "not configured" to the kernel
        self.filtering = target_pids is not None
        self.stacks = stacks
        self.set_targets(target_pids or set(), thresholds or {})

    def set_targets(self, pids: set[int], thresholds: dict[int, int] | None = None) -> None:
        """Watch ``pids`` (when filtering) and apply per-process thresholds."""
        thresholds = thresholds or {}
        wanted = {pid: thresholds.get(pid, 0) for pid in (pids if self.filtering else set())}
        wanted.update(thresholds)
        self.set_entries(b"targets", wanted)
        config = self._bpf[b"config"]
        leaf = config.Leaf()
        leaf.threshold_ns = self.threshold_ns
        leaf.filter_targets = int(self.filtering)
        leaf.has_overrides = int(bool(thresholds))
        leaf.stacks = int(self.stacks)
        leaf.wake_us = self.wake_us
        leaf.stacks_from_us = self.stacks_from_us
        config[ctypes.c_int(0)] = leaf



class RunqStacks(StackTable):
    """An event's victim and suspect stacks as stack ids; each distinct stack
    published once (collector/stacks.py)."""

    def of_event(self, raw: RawRunqEvent, pid: int) -> tuple[int, int]:
        """(victim stack id, suspect stack id), 0 for none."""
        return (self.resolve(pid, raw.comm, raw.victim_kernel, raw.victim_user),
                self.resolve(raw.suspect_pid, raw.suspect_comm, raw.suspect_kernel, raw.suspect_user))


class RunqSignal(LatencySignal):
    """The run-queue signal: tail waits one by one, every wait in histograms.
    Always on (not one of the ``hardware_probes``)."""

    name = "runq"
    publishes = (events.RunqEvent, events.LatencyHistogram, events.StackTrace)

    def __init__(self):
        super().__init__()
        self.stacks: RunqStacks | None = None
        self.own_skipped = 0  # waits of jitterscope's own processes, not published
        # others' waits behind one of jitterscope's own: the cost of watching, for `doctor` (collector-final.json)
        self.behind_own = {"waits": 0, "longest_wait_ns": 0}

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        s = context.settings
        self.probe = RunqProbe(int(s.runq_threshold_ms * 1_000_000), context.targets, context.thresholds,
                               stacks=s.runq_stacks, wake_ns=urgent_wait_ns(s),
                               stacks_from_ns=int(s.runq_alert_ms * 1_000_000))  # the waits alerts name
        self.stacks = RunqStacks(self.publish_stack, Symbolizer(helper=UserSymbolsHelper(own=context.own)))
        if s.runq_stacks:
            self.stacks.symbolizer.warm()
        self.probe.open(self.on_event)

    def publish_stack(self, stack_id: int, pid: int, comm: str, kernel: list[str], user: list[str]) -> None:
        self.ctx.publish(self.ctx.record(events.StackTrace, time.time_ns(), stack_id=stack_id, pid=pid,
                                         comm=comm, kernel=kernel, user=user))

    def on_event(self, raw: RawRunqEvent) -> None:
        self.events_read += 1
        ctx = self.ctx
        pid = raw.pid or hostinfo.tgid_of(raw.tid, ctx.proc) or raw.tid
        if pid in ctx.own:  # jitterscope's own wait is no user's alert (dropped before it takes a seq)
            self.own_skipped += 1
            return
        # own by pid (its role: collector, worker, ...), never by the name it gives itself
        suspect_comm, suspect_own = events.suspect_name(
            raw.suspect_comm, ctx.own.get(raw.suspect_pid) if raw.suspect_pid else None)
        if suspect_own:
            self.behind_own["waits"] += raw.waits
            one = raw.wait_ns if raw.waits <= 1 else 0  # a sum of short waits is no one wait
            self.behind_own["longest_wait_ns"] = max(self.behind_own["longest_wait_ns"], one)
        ctx.describe_process(pid)
        ctx.describe_process(raw.suspect_pid)
        # the stacks first: a StackTrace goes out before the event naming it
        victim_stack, suspect_stack = self.stacks.of_event(raw, pid) if self.stacks else (0, 0)
        ctx.publish(ctx.event(
            events.RunqEvent, raw.ts_ns, pid=pid, tid=raw.tid, comm=raw.comm, cpu=raw.cpu,
            wait_ns=raw.wait_ns, suspect_pid=raw.suspect_pid, suspect_tid=raw.suspect_tid,
            suspect_comm=suspect_comm, victim_stack=victim_stack, suspect_stack=suspect_stack, waits=raw.waits,
            suspect_own=suspect_own))

    def forget(self, pids: set[int]) -> None:
        super().forget(pids)
        if self.stacks:
            self.stacks.forget(pids)

    def close(self) -> None:
        if self.stacks:
            self.stacks.close()
            self.stacks = None
        super().close()

    def set_targets(self, targets: set[int] | None, thresholds: dict[int, int]) -> None:
        if self.probe:
            self.probe.set_targets(targets or set(), thresholds)

