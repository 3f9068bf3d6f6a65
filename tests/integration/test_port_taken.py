# SPDX-License-Identifier: Apache-2.0
"""A port already taken is one clear line: `up` checks every port of its
processes before it starts any, and the collector and the streams worker
check theirs as they start; each refusal names the port, the setting that
moves it and the process holding it -- for a second `up` on a host, the
first one's broker, worker and collector -- with no traceback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jitterscope.broker import free_port
from jitterscope.common import errors
from tests.integration.test_cli import CLI, cli_env, run

pytestmark = pytest.mark.integration

# a listener under a name of its own, so the line can be checked for it
_HOLDER = """import ctypes, socket, sys, time
ctypes.CDLL(None).prctl(15, b"jsportholder", 0, 0, 0)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder():
    """(pid, port) of another program listening on a port."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        yield proc.pid, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def refusal(result: subprocess.CompletedProcess) -> list[str]:
    """The lines of a refusal for taken ports: exit status, no traceback, and
    nothing but the error on stderr (a daemon's JSON logs aside)."""
    assert result.returncode == errors.PortTaken.exit_code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [l for l in result.stderr.strip().splitlines() if not l.startswith("{")]
    assert lines and lines[0].startswith("jitterscope: port "), result.stderr
    return lines


def test_up_refuses_a_taken_port_in_one_line_before_starting_anything(holder, tmp_path):
    pid, port = holder
    started = time.monotonic()
    result = run(["up", "--broker-port", "0", "--duration", "60", "--set", f"otlp_port={port}"], cli_env(tmp_path),
                 timeout=60)
    lines = refusal(result)
    assert len(lines) == 1, lines
    assert f"port {port} " in lines[0] and "OTLP" in lines[0] and "--set otlp_port=" in lines[0]
    assert f"held by jsportholder (pid {pid})" in lines[0]
    assert "watching" not in result.stdout
    assert not [p.name for p in tmp_path.glob("*.log")], "nothing was started"
    assert time.monotonic() - started < 30


@pytest.mark.bpf
def test_collector_and_worker_refuse_a_taken_port_in_one_line(broker, holder, tmp_path):
    pid, port = holder
    env = {**cli_env(tmp_path, JITTERSCOPE_BOOTSTRAP_SERVERS=broker.bootstrap_servers, JITTERSCOPE_OTLP_PORT="0"),
           "JITTERSCOPE_COLLECTOR_METRICS_PORT": str(port)}
    collector = refusal(run(["collector", "--duration", "30"], env))
    assert len(collector) == 1 and f"port {port} " in collector[0] and "collector_metrics_port" in collector[0]
    assert f"held by jsportholder (pid {pid})" in collector[0]

    otlp = refusal(run(["collector", "--duration", "30"], {**env, "JITTERSCOPE_COLLECTOR_METRICS_PORT": "0",
                                                             "JITTERSCOPE_OTLP_PORT": str(port)}))
    assert len(otlp) == 1 and "--set otlp_port=" in otlp[0] and f"(pid {pid})" in otlp[0]

    worker = refusal(run(["streams"], {**env, "JITTERSCOPE_STREAMS_WEB_PORT": str(port)}))
    assert len(worker) == 1 and "streams_web_port" in worker[0] and f"(pid {pid})" in worker[0]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.bpf
def test_a_second_up_names_each_port_the_first_one_holds(tmp_path):
    ports = {"broker_port": free_port(), "streams_web_port": free_port(), "collector_metrics_port": free_port(),
             "otlp_port": free_port()}
    args = ["up", "--duration", "300", *(a for name, p in ports.items() for a in ("--set", f"{name}={p}"))]
    env = cli_env(tmp_path, JITTERSCOPE_HOST=f"twice-{os.getpid()}")
    first = subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(first.stdout.readline, "")), daemon=True).start()
    try:
        deadline = time.monotonic() + 360
        while not any("jitterscope up: watching" in l for l in lines):
            assert first.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        collector_log = tmp_path / "collector.log"
        deadline = time.monotonic() + 120  # the collector's receiver starts once its probes are loaded
        while "OTLP receiver listening" not in collector_log.read_text(errors="replace"):
            assert first.poll() is None and time.monotonic() < deadline, collector_log.read_text()[-3000:]
            time.sleep(0.5)

        second = refusal(run(args, env, timeout=60))
        assert len(second) == len(ports), second
        for line, (name, port) in zip(second, ports.items()):
            assert f"port {port} " in line and f"--set {name}=PORT" in line, line
            held = re.search(r"held by (\S+) \(pid (\d+)[:)]", line)
            assert held, line
            assert parent_of(int(held[2])) == first.pid, f"{line}: not a child of the first up ({first.pid})"
        assert re.search(r"held by tansu\S* \(pid", second[0]), second[0]  # the embedded broker

        print("\n[refused] " + "\n[refused] ".join(second))
        assert first.poll() is None, "the first up runs on"
        assert "Address already in use" not in collector_log.read_text(errors="replace")
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
            try:
                first.wait(120)
            except subprocess.TimeoutExpired:
                first.kill()
                first.wait()
    assert first.returncode == 0, "".join(lines)
