# SPDX-License-Identifier: Apache-2.0
"""NVIDIA driver calls by name (schemas/nvidia.py): the request numbers user
space really passes decode to the open kernel module's names, whatever the
parameter size; UVM's plain numbers are told apart from RM escapes; anything
else stays hex; the stall alert and docs/hardware.md use the names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jitterscope.schemas import events, nvidia
from jitterscope.schemas.nvidia import ioctl_name, ioctl_request, iowr
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.rules.gpu_ioctl import gpu_ioctl_stall

ROOT = Path(__file__).resolve().parents[3]
MS = 1_000_000


@pytest.mark.parametrize("request_number, name", [
    (0xC020462A, "NV_ESC_RM_CONTROL"),        # NVOS54_PARAMETERS, 32 bytes
    (0xC030462B, "NV_ESC_RM_ALLOC"),          # NVOS64_PARAMETERS, 48 bytes
    (0xC020462B, "NV_ESC_RM_ALLOC"),          # NVOS21_PARAMETERS, 32 bytes: the driver takes both
    (0xC0104629, "NV_ESC_RM_FREE"),           # NVOS00_PARAMETERS
    (0xC038464E, "NV_ESC_RM_MAP_MEMORY"),     # nv_ioctl_nvos33_parameters_with_fd
    (0xC0384627, "NV_ESC_RM_ALLOC_MEMORY"),   # nv_ioctl_nvos02_parameters_with_fd
    (0xC90046C8, "NV_ESC_CARD_INFO"),         # an array of 32 nv_ioctl_card_info_t
    (0xC01046D3, "NV_ESC_IOCTL_XFER_CMD"),    # NV_IOCTL_BASE + 11
    (0xC00846DA, "NV_ESC_WAIT_OPEN_COMPLETE"),  # NV_IOCTL_BASE + 18
    (0x30000001, "UVM_INITIALIZE"),
    (0x30000002, "UVM_DEINITIALIZE"),
    (51, "UVM_MIGRATE"),
    (33, "UVM_MAP_EXTERNAL_ALLOCATION"),
    (75, "UVM_MM_INITIALIZE"),
    (2047, "UVM_IS_8_SUPPORTED"),
    (54, "UVM_ENABLE_SYSTEM_WIDE_ATOMICS"),   # 515.43.04's, gone since: old drivers still send it
    (0xC0204632, "NV_ESC_RM_CONFIG_GET"),     # likewise
])
def test_requests_decode_to_the_driver_names(request_number, name):
    assert ioctl_name(request_number) == name


@pytest.mark.parametrize("request_number", [
    0x541B,               # FIONREAD: not a driver call
    0xC0204660,           # an 'F' escape neither release defines
    iowr(0x2A, 32, ord("G")),  # NR of NV_ESC_RM_CONTROL under another type byte
    52, 0,                # UVM numbers with no call
    0x4602,               # FBIOGET_FSCREENINFO: type 'F' too, a framebuffer's, NR 2
])
def test_other_requests_stay_hex(request_number):
    assert ioctl_name(request_number) == f"0x{request_number:x}"


def test_a_request_is_read_as_the_kernels_unsigned_int():
    assert ioctl_name(0xFFFFFFFF_C020462A) == "NV_ESC_RM_CONTROL"
    assert ioctl_name(-0x3FDFB9D6) == "NV_ESC_RM_CONTROL"  # 0xC020462A as a C int


def test_every_name_round_trips_and_the_tables_do_not_overlap():
    for nr, name in nvidia.RM_ESCAPES.items():
        for size in (0, 16, 48, 0x3FFF):
            request = ioctl_request(name, size)
            assert (request & 0xFF, request >> 8 & 0xFF, request >> 16 & 0x3FFF, request >> 30) == (nr, 0x46, size, 3)
            assert ioctl_name(request) == name
    for number, name in nvidia.UVM_IOCTLS.items():
        assert ioctl_request(name) == number and ioctl_name(number) == name
        assert number >> 8 & 0xFF != nvidia.NV_IOCTL_MAGIC
    assert len(set(nvidia.RM_ESCAPES.values()) | set(nvidia.UVM_IOCTLS.values())) == \
        len(nvidia.RM_ESCAPES) + len(nvidia.UVM_IOCTLS)
    with pytest.raises(KeyError):
        ioctl_request("NV_ESC_NO_SUCH_CALL")
    with pytest.raises(ValueError):
        iowr(0x2A, 1 << 14)


def call(request: int, latency_ms: float = 60.4) -> events.GpuIoctl:
    return events.GpuIoctl(host="h", boot_id="b", seq=1, ts_ns=1, pid=42, tid=43, comm="vllm", fd=9,
                           request=request, latency_ns=int(latency_ms * MS), device="/dev/nvidia0")


def test_the_stall_alert_names_the_call():
    alert = gpu_ioctl_stall(call(0xC020462A), None, None, Thresholds.defaults(), 2)
    assert alert.summary == "vllm (pid 42, tid 43): NV_ESC_RM_CONTROL took 60 ms (GPU driver call on /dev/nvidia0)"
    assert alert.evidence["call"] == "NV_ESC_RM_CONTROL" and alert.evidence["request"] == "0xc020462a"
    uvm = gpu_ioctl_stall(call(51, 250), None, None, Thresholds.defaults(), 2)
    assert "UVM_MIGRATE took 250 ms" in uvm.summary and uvm.severity == "critical"
    unknown = gpu_ioctl_stall(call(0x541B), None, None, Thresholds.defaults(), 2)
    assert "): ioctl 0x541b took 60 ms" in unknown.summary and unknown.evidence["call"] == "0x541b"
    assert gpu_ioctl_stall(call(0xC020462A, 49), None, None, Thresholds.defaults(), 2) is None


def test_the_names_docs_hardware_md_gives_are_real():
    text = (ROOT / "docs" / "hardware.md").read_text()
    named = set(re.findall(r"\b(?:NV_ESC|UVM)_[A-Z0-9_]*[A-Z0-9]\b", text))
    assert {"NV_ESC_RM_CONTROL", "UVM_MIGRATE"} <= named
    assert named <= set(nvidia.RM_ESCAPES.values()) | set(nvidia.UVM_IOCTLS.values())
    for number, name in re.findall(r"`(0x[0-9a-f]+)` ([A-Z0-9_]+)", text):
        assert ioctl_name(int(number, 16)) == name, (number, name)
