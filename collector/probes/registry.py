# SPDX-License-Identifier: Apache-2.0
"""Every probe the collector can run, by name: the agent opens the enabled
ones in this order and loops over them (collector/agent.py). A name is a
value of the ``hardware_probes`` setting ("runq" is always on and not part of
it), from the signal catalogue (schemas/signals.py); its module is
collector/probes/<name>.py, holding one Probe subclass of that name (its
interface: collector/probes/interface.py). A new probe needs no line here.
"""

from __future__ import annotations

import importlib
from typing import Callable

from jitterscope.collector.probes.interface import Probe
from jitterscope.common.settings import CollectorSettings
from jitterscope.schemas.signals import HARDWARE_PROBES

ALWAYS_ON = ("runq",)


def _probe_class(name: str) -> type[Probe]:
    """The Probe subclass named ``name`` in collector/probes/<name>.py."""
    module = importlib.import_module(f"{__package__}.{name}")
    found = [cls for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Probe) and cls.__module__ == module.__name__
             and getattr(cls, "name", None) == name]
    if len(found) != 1:
        raise LookupError(f"collector/probes/{name}.py must define one Probe subclass with name = {name!r}")
    return found[0]


#: name -> factory (a Probe subclass: call it for an unopened signal)
PROBES: dict[str, Callable[[], Probe]] = {name: _probe_class(name) for name in (*ALWAYS_ON, *HARDWARE_PROBES)}


def enabled(settings: CollectorSettings) -> list[str]:
    """The names to run: the always-on ones, then ``hardware_probes`` (in
    registry order, each once)."""
    wanted = set(ALWAYS_ON) | set(settings.hardware_probes)
    return [name for name in PROBES if name in wanted]


def create(names: list[str]) -> list[Probe]:
    return [PROBES[name]() for name in names]
