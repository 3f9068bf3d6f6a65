# SPDX-License-Identifier: Apache-2.0
"""The "irq" signal and its loader for bpf/irq.bpf.c: time each CPU spends
in hard IRQ handlers (per IRQ number) and soft IRQs (per vector), and the
time the hypervisor took each vCPU away (steal: /proc/stat, in clock ticks).

The kernel keeps cumulative sums per (CPU, source); `IrqProbe.read` turns
them into deltas since the previous read. A hard IRQ's name is the handler
names the kernel lists under /proc/irq/N/ (one directory per action, as in
/proc/interrupts), read once per IRQ. Records go out every ``irq_interval_s``
(collector/probes/sampled.py: they are charged to waits of milliseconds).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from jitterscope.collector.probes import base
from jitterscope.collector.probes.interface import BccSignal, ProbeContext
from jitterscope.collector.probes.sampled import SampledSignal
from jitterscope.schemas import events

#: softirq vector -> name, as in /proc/softirqs (include/linux/interrupt.h)
SOFTIRQ_NAMES = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")


@dataclass(frozen=True)
class IrqSum:
    count: int
    time_ns: int


def diff(now: dict, seen: dict) -> dict:
    """Cumulative {key: (count, time_ns)} as deltas against ``seen`` (the
    previous read); keys with no new handler runs are left out. A count that
    went down (an entry deleted and restarted) counts from zero."""
    out = {}
    for key, (count, time_ns) in now.items():
        before = seen.get(key, (0, 0))
        if count < before[0]:
            before = (0, 0)
        if count > before[0]:
            out[key] = IrqSum(count - before[0], max(0, time_ns - before[1]))
    return out


class IrqProbe(base.BccProbe):
    source = "irq.bpf.c"

    def __init__(self):
        super().__init__()
        self._seen: dict[tuple[str, int, int], tuple[int, int]] = {}
        self.read()  # the baseline

    def poll(self, timeout_ms: int) -> None:
        """Nothing leaves this program one by one: its sums are read."""

    def _cumulative(self) -> dict[tuple[str, int, int], tuple[int, int]]:
        sums = {}
        soft = self._bpf[b"softirqs"]
        for vec in range(len(SOFTIRQ_NAMES)):
            for cpu, leaf in enumerate(soft.getvalue(ctypes.c_int(vec))):
                if leaf.count:
                    sums[("softirq", cpu, vec)] = (leaf.count, leaf.time_ns)
        for key, leaf in base.map_items(self._bpf[b"hardirqs"]):
            sums[("hardirq", key.cpu, key.irq)] = (leaf.count, leaf.time_ns)
        return sums

    def read(self) -> dict[tuple[str, int, int], IrqSum]:
        """(kind, cpu, irq or softirq vector) -> handler runs and their time
        since the previous read; kind is "hardirq" or "softirq"."""
        now = self._cumulative()
        out = diff(now, self._seen)
        self._seen = now
        return out


def steal_ticks(proc: Path = Path("/proc")) -> dict[tuple[str, int, int], tuple[int, int]]:
    """("steal", cpu, 0) -> (clock ticks, ns) the hypervisor ran something else
    on each vCPU since boot (/proc/stat's 8th per-CPU column; none on bare
    metal, or where the kernel does not count it)."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    out = {}
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) > 8 and fields[0].startswith("cpu") and fields[0][3:].isdigit() and int(fields[8]):
            out[("steal", int(fields[0][3:]), 0)] = (int(fields[8]), int(fields[8]) * tick_ns)
    return out


def irq_name(irq: int, proc: Path = Path("/proc")) -> str:
    """The handler names of IRQ ``irq`` (its actions, comma-joined), "" if unknown."""
    try:
        return ",".join(sorted(p.name for p in (proc / "irq" / str(irq)).iterdir() if p.is_dir()))
    except OSError:
        return ""


class IrqSignal(SampledSignal, BccSignal):
    """Hard and soft IRQ time per CPU and source. A (CPU, source) whose time
    is under ``irq_min_share`` of the interval makes no record: the timer
    tick and RCU run on every CPU all the time, and their microseconds would
    be most of the records and none of the causes."""

    name = "irq"
    publishes = (events.IrqTime,)

    def open(self, context: ProbeContext) -> None:
        self._names: dict[int, str] = {}
        self.probe = IrqProbe()
        self._stolen = steal_ticks(context.proc)
        self.start_clock(context, context.settings.irq_interval_s)

    def read(self) -> dict[tuple[str, int, int], IrqSum]:
        """The probe's interrupt time, and each vCPU's steal, since the last read."""
        stolen, self._stolen = self._stolen, steal_ticks(self.ctx.proc)
        return {**(self.probe.read() if self.probe else {}), **diff(self._stolen, stolen)}

    def source(self, kind: str, number: int) -> str:
        if kind == "steal":
            return "hypervisor"
        if kind == "softirq":
            return SOFTIRQ_NAMES[number] if number < len(SOFTIRQ_NAMES) else str(number)
        if number not in self._names:
            self._names[number] = irq_name(number, self.ctx.proc)
        return f"{number}:{self._names[number]}"

    def records(self, reading: dict[tuple[str, int, int], IrqSum], interval_ns: int,
                now_ns: int) -> list[events.Record]:
        floor = self.ctx.settings.irq_min_share * interval_ns
        return [self.ctx.record(events.IrqTime, now_ns, cpu=cpu, interval_ns=interval_ns, kind=kind,
                                source=self.source(kind, number), count=s.count, time_ns=s.time_ns)
                for (kind, cpu, number), s in sorted(reading.items())
                if s.time_ns and s.time_ns >= floor]
