# SPDX-License-Identifier: Apache-2.0
"""The commands a user types, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jitterscope.broker import free_port
from jitterscope.workload import HOG_COMM, VICTIM_COMM, starvation

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "jitterscope.cli"]


def cli_env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    env.update(JITTERSCOPE_DATA_DIR=str(tmp_path), JITTERSCOPE_STREAMS_WEB_PORT=str(free_port()),
               JITTERSCOPE_OTLP_PORT=str(free_port()),  # 4318 may be taken on this machine
               JITTERSCOPE_COLLECTOR_METRICS_PORT="0", JITTERSCOPE_KAFKA_SESSION_TIMEOUT_S="6")
    env.update(extra)  # a caller's choice wins
    return env


def run(args, env, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def children_nice(parent: int) -> dict[str, int]:
    """The niceness of each process ``parent`` started, by what it runs (its stage, or its program's name)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == parent:  # after the command: state, ppid, ... nice is stat's 19th field
            words = [w.decode(errors="replace") for w in cmdline if w]
            what = words[words.index("--stage") + 1] if "--stage" in words else \
                "collector" if "collector" in words else Path(words[0]).name
            out[what] = int(fields[16])
    return out


@pytest.mark.bpf
def test_up_prints_alerts_and_query_answers_during_and_after(tmp_path):
    env = cli_env(tmp_path)
    # the attribution-and-store process yields its CPU; the judge, the collector and the broker do not
    up = subprocess.Popen([*CLI, "up", "--duration", "180", "--broker-port", "0", "--comm", f"{VICTIM_COMM}*",
                           "--set", "up_background_nice=10"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 360  # "watching" comes once the collector's BPF is compiled and loaded
    while not any("jitterscope up: watching" in l for l in lines):
        assert up.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
    nice = children_nice(up.pid)
    broker = [what for what in nice if what.startswith("tansu")]  # the embedded broker's binary
    assert len(broker) == 1 and nice == {"judge": 0, "attribute-store": 10, "collector": 0, broker[0]: 0}, nice

    with starvation(seconds=6, hogs=3, delay=1.0):
        pass
    # Wait for what the assertions below need -- an alert that names the victim
    # and a hog -- not merely the first alert (which may be held by another task)
    deadline = time.monotonic() + 90
    while not any(VICTIM_COMM in l and f"held by {HOG_COMM}" in l for l in lines):
        assert up.poll() is None and time.monotonic() < deadline, "no hog-held alert in time:\n" + "".join(lines)
        time.sleep(0.2)

    # an alert is printed as soon as it is raised; its events are stored at the
    # next sink flush: ask until the store has them
    deadline = time.monotonic() + 60
    while True:
        during = run(["query", "-f", "csv", "SELECT count() FROM jitterscope.runq_events"], env)
        assert during.returncode == 0, during.stderr
        if int(during.stdout.splitlines()[1]) > 0:
            break
        assert time.monotonic() < deadline, "no run-queue events stored while up ran"
        time.sleep(0.5)

    up.send_signal(2)  # Ctrl-C
    assert up.wait(90) == 0
    reader.join(5)
    output = "".join(lines)
    alerts = [l for l in output.splitlines() if "waited" in l and VICTIM_COMM in l]
    assert alerts, output
    assert any(f"held by {HOG_COMM}" in l for l in alerts), output
    assert all(" ms for CPU " in l for l in alerts)
    assert "jitterscope stopped" in output

    after = run(["query", "-f", "json", "SELECT count() AS n FROM jitterscope.alerts WHERE comm = {c:String}",
                 "-p", f"c={VICTIM_COMM}"], env)
    assert after.returncode == 0, after.stderr
    assert '"n": ' in after.stdout and int(after.stdout.split('"n": ')[1].split("}")[0]) >= len(alerts)

    refused = run(["query", "DROP TABLE jitterscope.runq_events"], env)
    # refused before it runs (SQL safety check) or by the store's readonly setting
    assert refused.returncode != 0 and any(w in refused.stderr.lower() for w in ("readonly", "not allowed"))
    assert run(["query", "EXISTS TABLE jitterscope.runq_events", "-f", "csv"], env).stdout.splitlines()[1] == "1"


def test_collector_without_a_broker_says_how_to_fix_it(tmp_path):
    result = run(["collector"], cli_env(tmp_path))
    assert result.returncode == 78
    assert "--bootstrap-servers" in result.stderr and "jitterscope up" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_broker_is_one_clear_line(tmp_path):
    result = run(["collector", "--bootstrap-servers", f"127.0.0.1:{free_port()}"], cli_env(tmp_path))
    assert result.returncode == 69, result.stderr
    assert "is unreachable" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line


def test_bad_config_is_one_clear_line(tmp_path):
    result = run(["query", "SELECT 1"], cli_env(tmp_path, JITTERSCOPE_RUNQ_ALERT_MS="-3"))
    assert result.returncode == 78
    assert "runq_alert_ms" in result.stderr and "Traceback" not in result.stderr


def test_doctor_passes_on_a_prepared_host(tmp_path):
    result = run(["doctor"], cli_env(tmp_path))
    assert result.returncode == 0, result.stdout
    for check in ("privileges", "tracefs", "kernel headers", "bcc", "broker", "clickhouse"):
        assert check in result.stdout
    out = " ".join(result.stdout.split())
    assert "ok xid /dev/kmsg readable" in out and "ok nvml " in out  # NVML optional: said, never a failure


def test_help_lists_every_command(tmp_path):
    result = run(["--help"], cli_env(tmp_path))
    for command in ("up", "collector", "streams", "query", "doctor", "broker", "demo"):
        assert command in result.stdout


def test_any_setting_is_reachable_by_flag(tmp_path):
    env = cli_env(tmp_path)
    bad = run(["query", "--set", "request_slo_ms=-5", "SELECT 1"], env)
    assert bad.returncode == 78 and "request_slo_ms" in bad.stderr
    unknown = run(["doctor", "--set", "no_such_option=1"], env)
    assert unknown.returncode == 78 and "no_such_option" in unknown.stderr
    listed = run(["query", "--set", 'target_comms=["vllm*"]', "-f", "csv", "SELECT 1 AS one"], env)
    assert listed.returncode == 0 and listed.stdout.splitlines() == ["one", "1"]
