# SPDX-License-Identifier: Apache-2.0
"""NVML rule (signal: the nvml probe, topic jitterscope.gpu_telemetry): a GPU
clocked down against its will -- power cap, thermal or hardware slowdown
(schemas/gpu_health.py SLOWDOWNS) -- is a ``gpu_throttle`` alert naming the
GPU, its clocks and temperature, and the remedy of each reason. Pure: no I/O.
The requests on that GPU meanwhile name the reasons in their attributions
(streams/gpu_events.py)."""

from __future__ import annotations

from jitterscope.schemas.events import Alert, GpuTelemetry
from jitterscope.schemas.gpu_health import SLOWDOWNS, slowdowns
from jitterscope.streams.rules.base import Thresholds, alert


def judge(record: GpuTelemetry, state, t: Thresholds, now_ns: int) -> Alert | None:
    reasons = slowdowns(record.throttle)
    if not reasons:
        return None
    clocks = f"SM {record.sm_clock_mhz} MHz" + (f" of {record.sm_clock_max_mhz}" if record.sm_clock_max_mhz else "")
    summary = (f"GPU {record.gpu or record.pci} ({record.pci}) clocked down: {', '.join(reasons)} "
               f"({clocks}, {record.temperature_c} C, {record.power_mw / 1000:.0f} W)")
    severity = "critical" if any(r.startswith("hw_") for r in reasons) else "warning"
    return alert(record, "gpu_throttle", severity, 0, "", summary, "; ".join(SLOWDOWNS[r] for r in reasons), now_ns,
                 {"gpu": record.gpu, "pci": record.pci, "throttle": ",".join(reasons),
                  "sm_clock_mhz": str(record.sm_clock_mhz), "temperature_c": str(record.temperature_c)})


def repeat_key(record: GpuTelemetry) -> tuple:
    """One alert per GPU per quiet period: a slowdown lasts many readings."""
    return (record.pci,)
