"""Loading BCC programs, and the checks that say why one cannot load.

The same checks back `jitterscope doctor` and the collector's start-up, so a
user sees one message with the fix, not a clang error.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from jitterscope import errors

TRACEFS_ROOTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    error: type[errors.JitterscopeError] = errors.JitterscopeError


def check_privileges() -> Check:
    if os.geteuid() == 0:
        return Check("privileges", True, "running as root")
    caps = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
    cap_bpf, cap_perfmon, cap_sys_admin = 1 << 39, 1 << 38, 1 << 21
    if caps & cap_sys_admin or (caps & cap_bpf and caps & cap_perfmon):
        return Check("privileges", True, "has CAP_BPF+CAP_PERFMON")
    return Check(
        "privileges", False, "not root and lacks CAP_BPF/CAP_PERFMON",
        "run as root (sudo jitterscope ...) or grant cap_bpf,cap_perfmon,cap_sys_resource",
        errors.NotPrivileged,
    )


def tracefs_root() -> Path | None:
    for root in TRACEFS_ROOTS:
        if (root / "events/sched/sched_switch/format").exists():
            return root
    return None


def check_tracefs() -> Check:
    root = tracefs_root()
    if root:
        return Check("tracefs", True, f"sched tracepoints at {root}")
    return Check(
        "tracefs", False, "tracefs is not mounted (no events/sched/sched_switch)",
        "mount -t tracefs tracefs /sys/kernel/tracing   (or: make setup)",
        errors.TracefsMissing,
    )


def check_headers() -> Check:
    build = Path("/lib/modules") / platform.release() / "build"
    if (build / "include").is_dir():
        target = build.resolve()
        generic = platform.release() not in target.name
        note = f" (generic {target.name}: tracepoint-argument programs only)" if generic else ""
        return Check("kernel headers", True, f"{build} -> {target}{note}")
    return Check(
        "kernel headers", False, f"no kernel headers at {build}",
        f"apt-get install linux-headers-{platform.release()}   (or: make setup, which links generic headers)",
        errors.KernelHeadersMissing,
    )


def check_bcc() -> Check:
    try:
        import bcc  # noqa: F401
    except ImportError:
        return Check(
            "bcc", False, "the bcc Python module is not importable",
            "apt-get install python3-bpfcc and link it into the venv (make setup); "
            "PyPI's 'bcc' is an unrelated package",
            errors.BccMissing,
        )
    return Check("bcc", True, f"bcc from {Path(bcc.__file__).parent}")


def check_kprobes() -> Check:
    root = tracefs_root()
    has = bool(root and (root / "kprobe_events").exists())
    return Check("kprobes", True, "available" if has else "not compiled in (tracepoint paths are used)")


def preflight() -> list[Check]:
    return [check_privileges(), check_tracefs(), check_headers(), check_bcc(), check_kprobes()]


def require_loadable() -> None:
    """Raise the first failing check as its typed error."""
    for check in preflight():
        if not check.ok:
            raise check.error(f"{check.detail}: {check.fix}")


def bpf_source(name: str) -> Path:
    return Path(str(resources.files("jitterscope.bpf").joinpath(name)))


def load(source_name: str):
    """Compile and load ``bpf/<source_name>`` with BCC (tracepoints auto-attach)."""
    require_loadable()
    from bcc import BPF

    source = bpf_source(source_name)
    try:
        return BPF(src_file=str(source).encode(), cflags=[f"-I{source.parent}"])
    except Exception as exc:  # BCC raises bare Exception on compile/load errors
        raise errors.ProbeLoadFailed(
            f"could not load {source_name}: {exc}; run 'jitterscope doctor' to check the host"
        ) from exc
