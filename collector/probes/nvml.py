# SPDX-License-Identifier: Apache-2.0
"""The "nvml" signal: each GPU's clocks, clock-throttle reasons,
temperature, power, PCIe throughput and NVLink errors from NVML (the
optional ``nvidia-ml-py`` package, imported as ``pynvml``), every
``nvml_interval_s``, as GpuTelemetry records. The throttle bits are decoded
into names here (schemas/gpu_health.py); the streams worker alerts on
slowdowns (streams/rules/nvml.py) and names them in the attributions of the
requests on that GPU (streams/gpu_events.py).

Where the library or the driver is missing (most hosts, every CI machine),
``open`` logs one line and the signal stays silent: no thread, no retry.
NVML is read on a sampler thread of its own (collector/probes/sampled.py): a
call can take milliseconds per GPU, which the agent's loop must not wait for.
A reading NVML does not support on a GPU (vGPU, MIG, consumer boards) is 0,
and a GPU whose handle fails (fallen off the bus: its Xid says so) is skipped
for that reading.

Only the decoding is tested here without a GPU (tests/unit/collector/probes/
test_nvml.py, with a fake ``pynvml`` module); docs/hardware.md says so.
"""

from __future__ import annotations

import logging
from typing import Any

from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.probes.sampled import SampledSignal
from jitterscope.common.logs import fields
from jitterscope.schemas import events
from jitterscope.schemas.gpu_health import decode_throttle
from jitterscope.schemas.topology import normalize_pci_address

log = logging.getLogger("jitterscope.collector.nvml")

# nvml.h's values, for a pynvml that lacks a name (they have not changed since NVML began)
_CLOCK_SM, _CLOCK_MEM, _TEMPERATURE_GPU, _PCIE_TX, _PCIE_RX = 1, 2, 0, 0, 1
#: nvmlNvLinkErrorCounter_t: DL replay, DL recovery, DL CRC flit, DL CRC data
NVLINK_COUNTERS = (0, 1, 2, 3)
NVLINK_MAX_LINKS = 18


def load_nvml(module: Any = None) -> Any | None:
    """``pynvml`` initialised, or None (with one log line) where the
    library or the driver is missing. ``module``: a stand-in for tests."""
    if module is None:
        try:
            import pynvml as module  # nvidia-ml-py, optional
        except ImportError:
            log.info("NVML telemetry off: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
            return None
    error = getattr(module, "NVMLError", Exception)
    try:
        module.nvmlInit()
    except error as exc:  # no libnvidia-ml.so, or no driver loaded: the same answer every time, so asked once
        log.info("NVML telemetry off: NVML did not start", extra=fields(error=str(exc)))
        return None
    return module


class Gpu:
    """One GPU's handle, names and running NVLink error total."""

    def __init__(self, nvml: Any, index: int):
        self.nvml, self.error = nvml, getattr(nvml, "NVMLError", Exception)
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.pci = normalize_pci_address(nvml.nvmlDeviceGetPciInfo(self.handle).busId)
        self.name = str(index)  # as collector/topology.py names a GPU NVML knows
        self.links = [link for link in range(NVLINK_MAX_LINKS) if self._int("nvmlDeviceGetNvLinkState", link) == 1]
        self.sm_max = self._int("nvmlDeviceGetMaxClockInfo", _const(nvml, "NVML_CLOCK_SM", _CLOCK_SM))
        self._nvlink_total = self.nvlink_errors()

    def _int(self, call: str, *args) -> int:
        """An integer reading, 0 where this pynvml or this GPU lacks it."""
        function = getattr(self.nvml, call, None)
        if function is None:
            return 0
        try:
            return int(function(self.handle, *args))
        except (self.error, TypeError, ValueError):
            return 0

    def nvlink_errors(self) -> int:
        return sum(self._int("nvmlDeviceGetNvLinkErrorCounter", link, counter)
                   for link in self.links for counter in NVLINK_COUNTERS)

    def read(self) -> dict:
        """GpuTelemetry's fields for now (NVLink errors: since the last read)."""
        n = self.nvml
        mask = self._int("nvmlDeviceGetCurrentClocksEventReasons") or \
            self._int("nvmlDeviceGetCurrentClocksThrottleReasons")  # the older name
        total = self.nvlink_errors()
        new, self._nvlink_total = max(0, total - self._nvlink_total), total
        return {
            "pci": self.pci, "gpu": self.name,
            "sm_clock_mhz": self._int("nvmlDeviceGetClockInfo", _const(n, "NVML_CLOCK_SM", _CLOCK_SM)),
            "mem_clock_mhz": self._int("nvmlDeviceGetClockInfo", _const(n, "NVML_CLOCK_MEM", _CLOCK_MEM)),
            "sm_clock_max_mhz": self.sm_max, "throttle_reasons": mask, "throttle": decode_throttle(mask),
            "temperature_c": min(self._int("nvmlDeviceGetTemperature",
                                           _const(n, "NVML_TEMPERATURE_GPU", _TEMPERATURE_GPU)), 0xFFFF),
            "power_mw": self._int("nvmlDeviceGetPowerUsage"),
            "pcie_tx_kbps": self._int("nvmlDeviceGetPcieThroughput", _const(n, "NVML_PCIE_UTIL_TX_BYTES", _PCIE_TX)),
            "pcie_rx_kbps": self._int("nvmlDeviceGetPcieThroughput", _const(n, "NVML_PCIE_UTIL_RX_BYTES", _PCIE_RX)),
            "nvlink_errors": new,
        }


def _const(nvml: Any, name: str, default: int) -> int:
    return getattr(nvml, name, default)


def find_gpus(nvml: Any) -> list[Gpu]:
    """Every GPU NVML sees whose handle answers."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        count = nvml.nvmlDeviceGetCount()
    except error as exc:
        log.info("NVML telemetry off: NVML counts no GPU", extra=fields(error=str(exc)))
        return []
    gpus = []
    for index in range(count):
        try:
            gpus.append(Gpu(nvml, index))
        except error as exc:  # fallen off the bus, or lost: the others are still read
            log.warning("NVML cannot open a GPU", extra=fields(index=index, error=str(exc)))
    return gpus


class NvmlSignal(SampledSignal):
    """GpuTelemetry per GPU every ``nvml_interval_s``; silent without NVML."""

    name = "nvml"
    publishes = (events.GpuTelemetry,)

    def __init__(self, nvml: Any = None):
        super().__init__()
        self._module = nvml  # a stand-in for tests; None: import pynvml
        self.nvml: Any = None
        self.gpus: list[Gpu] = []

    def open(self, context: ProbeContext) -> None:
        self.ctx = context
        self.nvml = load_nvml(self._module)
        self.gpus = find_gpus(self.nvml) if self.nvml else []
        if self.gpus:  # no thread at all without a GPU to read
            self.start_clock(context, context.settings.nvml_interval_s)

    def read(self) -> list[dict]:
        out = []
        for gpu in self.gpus:
            try:
                out.append(gpu.read())
            except Exception:  # noqa: BLE001 -- one GPU's failure never stops the others' readings
                continue
        return out

    def records(self, reading: list[dict], interval_ns: int, now_ns: int) -> list[events.Record]:
        return [self.ctx.record(events.GpuTelemetry, now_ns, interval_ns=interval_ns, **values) for values in reading]

    def close(self) -> None:
        super().close()
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 -- shutting down: nothing left to do about it
                pass
            self.nvml = None
