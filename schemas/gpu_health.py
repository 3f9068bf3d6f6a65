# SPDX-License-Identifier: Apache-2.0
"""What a GPU's own health reports mean: NVIDIA Xid error codes (the xid
signal, collector/probes/xid.py) and NVML's clock-throttle reason bits (the
nvml signal, collector/probes/nvml.py). Pure tables and look-ups, no I/O: the
collector decodes with them, the rules (streams/rules/xid.py, nvml.py) and
the attributor (streams/gpu_events.py) name with them, docs/hardware.md
lists them.

Xid meanings and remedies are NVIDIA's, shortened, from the Xid catalogue:
https://docs.nvidia.com/deploy/xid-errors/index.html (the per-code table of
"Xid Errors", and for Ampere and later
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, its
"Resolution Bucket" columns: RESTART_APP, RESET_GPU, CONTACT_SUPPORT...) and
https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html (48,
63, 64). A code not in the table is still reported, by number, with the
catalogue to look it up in.

Throttle bits: nvidia-ml-py's pynvml.py, ``nvmlClocksThrottleReason*`` (the
newer ``nvmlClocksEventReason*`` have the same values), as nvml.h defines them.
"""

from __future__ import annotations

from typing import NamedTuple

XID_CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class XidInfo(NamedTuple):
    meaning: str
    severity: str  # "critical": the GPU (or every process on it) is hurt; "warning": one application
    remedy: str


_RESTART_APP = "restart the application; if it repeats with the same code, check the application and driver"
_RESET_GPU = "drain the GPU and reset it (nvidia-smi -r -i <gpu>) or reboot the host"

XIDS: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing (channel idle timeout)", "warning", _RESTART_APP),
    13: XidInfo("Graphics engine exception: a kernel hit an illegal instruction or address (usually the "
                "application's bug)", "warning", _RESTART_APP + " (run it under compute-sanitizer)"),
    31: XidInfo("GPU memory page fault: the application touched memory it does not own (illegal address)",
                "warning", _RESTART_APP + " (run it under compute-sanitizer)"),
    32: XidInfo("invalid or corrupted push buffer stream", "warning", _RESTART_APP),
    38: XidInfo("driver firmware error", "critical", _RESET_GPU + "; update the driver if it repeats"),
    43: XidInfo("GPU stopped processing: the application hit a software fault; the GPU itself is healthy",
                "warning", _RESTART_APP),
    45: XidInfo("preemptive cleanup: the driver ended the application's channels after an earlier error "
                "(or it was killed)", "warning", "look for the Xid logged before it on this GPU; that is the cause"),
    46: XidInfo("GPU stopped processing", "critical", _RESET_GPU),
    48: XidInfo("double-bit ECC error (uncorrectable memory error)", "critical",
                _RESET_GPU + " so the page is retired or the row remapped; service the GPU if it repeats"),
    61: XidInfo("internal micro-controller breakpoint/warning", "critical", _RESET_GPU),
    62: XidInfo("internal micro-controller halt", "critical", _RESET_GPU),
    63: XidInfo("ECC page retirement or row remapping recorded: takes effect at the next GPU reset",
                "warning", "drain the GPU and reset it when convenient, to activate the retirement or remap"),
    64: XidInfo("ECC page retirement or row remapping failed", "critical",
                "drain the GPU; reset it, and service (RMA) it if the failure repeats"),
    68: XidInfo("video decoder (NVDEC) exception", "warning", _RESTART_APP),
    69: XidInfo("graphics engine class error", "warning", _RESTART_APP),
    74: XidInfo("NVLink error", "critical",
                "check the NVLink connections (nvidia-smi nvlink -e); " + _RESET_GPU + "; service it if it repeats"),
    79: XidInfo("GPU has fallen off the bus: it no longer answers on PCIe", "critical",
                "drain the host and reboot it; check the GPU's PCIe seating, power and temperature, and service it "
                "if it repeats"),
    92: XidInfo("high single-bit ECC error rate", "warning",
                "watch the GPU's ECC counters (nvidia-smi -q -d ECC); service it if the rate stays high"),
    94: XidInfo("contained ECC error: only the application using the bad memory was stopped", "warning",
                "restart the application; reset the GPU when convenient to remap the row"),
    95: XidInfo("uncontained ECC error: every application on the GPU is affected", "critical", _RESET_GPU),
    109: XidInfo("context switch timeout", "warning", _RESTART_APP),
    119: XidInfo("GSP (GPU System Processor) RPC timeout", "critical",
                 _RESET_GPU + "; update the driver if it repeats"),
    120: XidInfo("GSP (GPU System Processor) error", "critical", _RESET_GPU + "; update the driver if it repeats"),
    140: XidInfo("unrecovered ECC error", "critical", _RESET_GPU),
}


def xid_info(xid: int) -> XidInfo:
    """The code's meaning, severity and remedy; a code not in the table is
    named by number, with the catalogue to look it up in."""
    return XIDS.get(xid) or XidInfo(f"Xid {xid} (see {XID_CATALOGUE})", "warning",
                                    f"look the code up in NVIDIA's Xid catalogue ({XID_CATALOGUE})")


#: NVML clock-throttle reason bits -> the name the records carry (nvmlClocksThrottleReason*)
THROTTLE_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
}

#: the reasons that slow a busy GPU down against its will: power cap, thermal,
#: hardware slowdown (the rest are idle, a clock setting or a boost group)
SLOWDOWNS: dict[str, str] = {
    "sw_power_cap": "power cap: the GPU draws its power limit and clocks down (check nvidia-smi -q -d POWER; "
                    "raise the limit with nvidia-smi -pl if the board allows, or spread the load)",
    "hw_slowdown": "hardware slowdown: clocks cut by half or more (power supply or thermal protection; "
                   "check the PSU, cabling and cooling)",
    "sw_thermal_slowdown": "thermal slowdown: the GPU is too hot and clocks down (check cooling and airflow)",
    "hw_thermal_slowdown": "hardware thermal slowdown: clocks cut by half or more, the GPU is too hot "
                           "(check cooling and airflow now)",
    "hw_power_brake": "hardware power brake: an external power-brake signal cut the clocks (check the "
                      "chassis' power supply)",
}


def decode_throttle(mask: int) -> list[str]:
    """NVML's clock-throttle bitmask as names, lowest bit first; an unknown
    bit as its hex value (newer drivers add reasons)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.append(f"0x{bit:x}")
        bit <<= 1
    return names


def slowdowns(names: list[str]) -> list[str]:
    """Of a record's throttle names, those that slow a busy GPU (SLOWDOWNS)."""
    return [n for n in names if n in SLOWDOWNS]
