# SPDX-License-Identifier: Apache-2.0
"""Every signal the collector can run, by name: the agent opens the enabled
ones in this order and loops over them (collector/agent.py). A name is the
value of the ``hardware_probes`` setting ("runq" is always on and not part of
it); a signal's module is collector/probes/<module>.py, its interface
collector/probes/interface.py.
"""

from __future__ import annotations

from typing import Callable

from jitterscope.collector.probes.blocked import BlockedSignal
from jitterscope.collector.probes.blockio import BlockIoSignal
from jitterscope.collector.probes.gpu_ioctl import GpuIoctlSignal
from jitterscope.collector.probes.interface import Probe
from jitterscope.collector.probes.irq import IrqSignal
from jitterscope.collector.probes.migrate import MigrateSignal
from jitterscope.collector.probes.netdev import NetdevSignal
from jitterscope.collector.probes.pages import PagesSignal
from jitterscope.collector.probes.runq import RunqSignal
from jitterscope.collector.probes.throttle import CfsSignal
from jitterscope.common.settings import CollectorSettings

ALWAYS_ON = ("runq",)

#: name -> factory (a Probe subclass: call it for an unopened signal)
PROBES: dict[str, Callable[[], Probe]] = {
    cls.name: cls
    for cls in (RunqSignal, GpuIoctlSignal, MigrateSignal, PagesSignal, BlockIoSignal, NetdevSignal,
                IrqSignal, CfsSignal, BlockedSignal)
}


def enabled(settings: CollectorSettings) -> list[str]:
    """The names to run: the always-on ones, then ``hardware_probes`` (in
    registry order, each once)."""
    wanted = set(ALWAYS_ON) | set(settings.hardware_probes)
    return [name for name in PROBES if name in wanted]


def create(names: list[str]) -> list[Probe]:
    return [PROBES[name]() for name in names]
