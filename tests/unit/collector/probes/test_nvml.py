# SPDX-License-Identifier: Apache-2.0
"""The nvml probe's decoding, with a fake ``pynvml`` module (no GPU on the
build machines; docs/hardware.md says this is all that checks it): the
throttle bitmask as names (nvml.h's bits), every reading in its record field
and unit, NVLink errors as deltas over the active links only, a reading the
GPU does not support as 0, a GPU whose handle fails skipped; no library, or
NVMLError at init, is one log line, no thread and no retry."""

from __future__ import annotations

import logging
import sys
import threading
import types

import pytest

from jitterscope.collector.probes import nvml as probe
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.common.settings import Settings
from jitterscope.schemas import events
from jitterscope.schemas.gpu_health import decode_throttle, slowdowns


class NVMLError(Exception):
    pass


class Stamp:
    def header(self, record_type, ts_ns):
        return dict(host="h", boot_id="b", seq=0, ts_ns=ts_ns)


def fake_nvml(gpus: dict, init_error: bool = False, lost: tuple = ()) -> types.SimpleNamespace:
    """A pynvml stand-in: ``gpus`` is index -> readings; calls count in ``calls``."""
    calls: dict[str, int] = {}

    def call(name, fn):
        def wrapped(*args):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args)
        return wrapped

    def init():
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    def handle(index):
        if index in lost:
            raise NVMLError("GPU is lost")
        return index

    def reading(key):
        def get(h, *args):
            value = gpus[h].get(key)
            if value is None:
                raise NVMLError("Not Supported")
            return value(*args) if callable(value) else value
        return get

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0,
        NVML_PCIE_UTIL_TX_BYTES=0, NVML_PCIE_UTIL_RX_BYTES=1, calls=calls,
        nvmlInit=call("init", init), nvmlShutdown=call("shutdown", lambda: None),
        nvmlDeviceGetCount=lambda: len(gpus) + len(lost), nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=gpus[h]["bus"]),
        nvmlDeviceGetClockInfo=reading("clock"), nvmlDeviceGetMaxClockInfo=reading("max_clock"),
        nvmlDeviceGetCurrentClocksThrottleReasons=reading("throttle"),
        nvmlDeviceGetTemperature=reading("temperature"), nvmlDeviceGetPowerUsage=reading("power"),
        nvmlDeviceGetPcieThroughput=reading("pcie"), nvmlDeviceGetNvLinkState=reading("link_state"),
        nvmlDeviceGetNvLinkErrorCounter=call("nvlink", reading("nvlink")))


def test_throttle_bits_decode_to_names():
    assert decode_throttle(0) == []
    assert decode_throttle(0x1) == ["gpu_idle"]
    assert decode_throttle(0x4 | 0x8 | 0x40) == ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"]
    assert decode_throttle(0x1FF) == ["gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost",
                                      "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake", "display_clocks"]
    assert decode_throttle(0x80 | 0x400 | 1 << 40) == ["hw_power_brake", "0x400", "0x10000000000"]
    assert slowdowns(decode_throttle(0x1FF)) == ["sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                                                 "hw_thermal_slowdown", "hw_power_brake"]
    assert slowdowns(["gpu_idle", "applications_clocks", "sync_boost", "display_clocks"]) == []


def a100(bus: str, nvlink: dict) -> dict:
    return {"bus": bus, "clock": {1: 1410, 2: 1215}.get, "max_clock": {1: 1410}.get, "throttle": 0x4 | 0x40,
            "temperature": 84, "power": 398_123, "pcie": {0: 1200, 1: 3400}.get,
            "link_state": lambda link: 1 if link < 2 else 0,
            "nvlink": lambda link, counter: nvlink[(link, counter)]}


def opened(nvml, interval_s=3600.0) -> tuple[probe.NvmlSignal, list]:
    published: list = []
    signal = probe.NvmlSignal(nvml)
    signal.open(ProbeContext(settings=Settings.model_construct(nvml_interval_s=interval_s), stamp=Stamp(),
                             publish=published.append, describe_process=lambda pid: None, comm_of=lambda pid: ""))
    return signal, published


def test_every_reading_lands_in_its_field():
    counters = {(link, c): 0 for link in range(2) for c in range(4)}
    nvml = fake_nvml({0: a100(b"00000000:3B:00.0", counters),
                      1: {"bus": "00000000:86:00.0", "throttle": 0x1}}, lost=())  # a GPU that supports little
    signal, _ = opened(nvml)
    counters[(0, 2)] += 5  # CRC flit errors on link 0, and replays on link 1, since open
    counters[(1, 0)] += 2
    records = signal.periodic(1_000_000_000, 1_800_000_000_000_000_000)
    signal.close()
    assert [type(r) for r in records] == [events.GpuTelemetry] * 2
    full, bare = records
    assert (full.pci, full.gpu, full.sm_clock_mhz, full.mem_clock_mhz, full.sm_clock_max_mhz) == \
        ("0000:3b:00.0", "0", 1410, 1215, 1410)
    assert (full.throttle_reasons, full.throttle) == (0x44, ["sw_power_cap", "hw_thermal_slowdown"])
    assert (full.temperature_c, full.power_mw, full.pcie_tx_kbps, full.pcie_rx_kbps, full.nvlink_errors) == \
        (84, 398_123, 1200, 3400, 7)
    assert full.interval_ns > 0
    assert (bare.pci, bare.gpu, bare.throttle, bare.sm_clock_mhz, bare.power_mw, bare.nvlink_errors) == \
        ("0000:86:00.0", "1", ["gpu_idle"], 0, 0, 0)
    # NVLink: only the two active links asked (4 counters each), once at open and once per reading
    assert nvml.calls["nvlink"] == 2 * 4 * 2
    assert nvml.calls["shutdown"] == 1


def test_nvlink_errors_are_deltas_and_a_lost_gpu_is_skipped():
    counters = {(link, c): 10 for link in range(2) for c in range(4)}
    signal, _ = opened(fake_nvml({0: a100(b"00000000:3B:00.0", counters)}, lost=(1,)))
    assert [g.pci for g in signal.gpus] == ["0000:3b:00.0"]
    assert [r.nvlink_errors for r in signal.periodic(1, 2)] == [0]  # 80 at open: none new
    counters[(1, 3)] += 4
    assert [r.nvlink_errors for r in signal.periodic(1, 3)] == [4]
    assert [r.nvlink_errors for r in signal.periodic(1, 4)] == [0]
    signal.close()


def test_the_sampler_thread_publishes_every_interval():
    signal, published = opened(fake_nvml({0: a100(b"00000000:3B:00.0", {(l, c): 0 for l in range(2)
                                                                        for c in range(4)})}), interval_s=0.02)
    try:
        for _ in range(500):
            signal.poll(0)
            if len(published) >= 3:
                break
            threading.Event().wait(0.01)
        assert len(published) >= 3 and all(r.throttle == ["sw_power_cap", "hw_thermal_slowdown"] for r in published)
    finally:
        signal.close()


def test_no_library_is_one_line_and_no_thread(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    threads = threading.active_count()
    with caplog.at_level(logging.INFO, logger="jitterscope.collector.nvml"):
        signal, published = opened(None, interval_s=0.01)
        for _ in range(5):
            signal.poll(0)
        assert signal.periodic(1, 2) == []
    signal.close()
    assert [r.getMessage() for r in caplog.records] == [
        "NVML telemetry off: nvidia-ml-py is not installed (pip install nvidia-ml-py)"]
    assert published == [] and signal.gpus == [] and threading.active_count() == threads


def test_nvml_error_at_init_is_one_line_and_never_retried(caplog):
    nvml = fake_nvml({}, init_error=True)
    threads = threading.active_count()
    with caplog.at_level(logging.INFO, logger="jitterscope.collector.nvml"):
        signal, published = opened(nvml, interval_s=0.01)
        for _ in range(5):
            signal.poll(0)
            assert signal.periodic(1, 2) == []
    signal.close()
    assert [r.getMessage() for r in caplog.records] == ["NVML telemetry off: NVML did not start"]
    assert caplog.records[0].fields == {"error": "NVML Shared Library Not Found"}
    assert nvml.calls["init"] == 1 and "shutdown" not in nvml.calls
    assert published == [] and threading.active_count() == threads


@pytest.mark.parametrize("name", ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"])
def test_either_name_of_the_throttle_call(name):
    """nvidia-ml-py renamed "throttle" reasons to "event" reasons (12.535): both are read."""
    nvml = fake_nvml({0: {"bus": "0000:3b:00.0"}})
    delattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    setattr(nvml, name, lambda h: 0x8)
    signal, _ = opened(nvml)
    assert [r.throttle for r in signal.periodic(1, 2)] == [["hw_slowdown"]]
    signal.close()
