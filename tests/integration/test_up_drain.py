# SPDX-License-Identifier: Apache-2.0
"""Ctrl-C on `jitterscope up` during a context-switch storm loses nothing:
`up` waits until the worker has stored what the collector sent, and the
stopped store then holds exactly the collector's own sent counts, per topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from jitterscope.broker import free_port
from jitterscope.schemas import topics
from jitterscope.up import FINAL_FILE
from jitterscope.streams.clickhouse import TABLE_OF
from jitterscope.workload import cpu_hogs, last_cpu
from tests.integration.test_cli import CLI, cli_env, run

pytestmark = [pytest.mark.integration, pytest.mark.bpf]

# a thread that sleeps 0.2 ms in a loop: thousands of wake-ups a second, each
# waiting a little for a CPU shared with the others and a hog
_SLEEPER = """import ctypes, time
ctypes.CDLL(None).prctl(15, b"jsstorm", 0, 0, 0)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    time.sleep(0.0002)
"""


@contextmanager
def storm(seconds: float, sleepers: int = 6):
    cpu = last_cpu()
    procs = [subprocess.Popen([sys.executable, "-c", _SLEEPER.format(seconds=seconds)],
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) for _ in range(sleepers)]
    try:
        with cpu_hogs(seconds, cpu, count=1):
            yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def wait_for(predicate, timeout: float, what: str, up: subprocess.Popen, lines: list[str]):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert up.poll() is None, f"up exited ({up.returncode}) waiting for {what}:\n" + "".join(lines)
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}:\n" + "".join(lines)
        time.sleep(0.5)
    return value


def stored_runq(env) -> int:
    result = run(["query", "-f", "csv", "SELECT count() FROM jitterscope.runq_events"], env)
    return int(result.stdout.splitlines()[1]) if result.returncode == 0 else 0


def test_ctrl_c_during_a_storm_stores_everything_the_collector_sent(tmp_path):
    host = f"drain-{os.getpid()}"
    env = cli_env(tmp_path, JITTERSCOPE_HOST=host)
    # every wait of 20 us or more leaves the kernel: a storm of events; alerts only at 1 s (rare).
    # The worker inserts only every 8 s, so at Ctrl-C it is surely behind: a fixed
    # few seconds' wait would lose the tail, waiting on counts must not.
    # Every port free (cli_env: the worker's web port; metrics off; the
    # broker's and OTLP's here): the defaults may be taken on this host.
    up = subprocess.Popen([*CLI, "up", "--broker-port", "0", "--threshold-ms", "0.02", "--alert-ms", "1000",
                           "--set", "drain_timeout_s=300", "--set", "sink_flush_s=8",
                           "--set", f"otlp_port={free_port()}"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("jitterscope up: watching" in l for l in lines), 360, "up to start", up, lines)
        with storm(seconds=300):
            # stop while events still pour in and the worker is behind
            at_stop = wait_for(lambda: (n := stored_runq(env)) >= 20_000 and n, 180, "20,000 events stored", up, lines)
            stopped_at = time.monotonic()
            up.send_signal(2)  # Ctrl-C
        assert up.wait(420) == 0, "".join(lines)
        stop_s = time.monotonic() - stopped_at
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    reader.join(5)
    output = "".join(lines)
    assert "not stored" not in output and "could not confirm" not in output, output
    assert "stored all" in output, output
    print("\n" + "".join(l for l in lines if not l.startswith(("jitterscope up:", " "))))

    final_path = tmp_path / FINAL_FILE
    assert final_path.exists(), f"the collector wrote no {FINAL_FILE}:\n{output}"
    final = json.loads(final_path.read_text())
    sent = {t: n for t, n in final["sent_by_topic"].items() if n}
    assert sent.get(topics.RUNQ, 0) > 20_000, final

    # the worker is gone: `query` opens the stopped store itself
    table_of_topic = {t: TABLE_OF[record_type] for t, record_type in topics.INPUT_TOPICS.items()}
    sql = " UNION ALL ".join(
        f"SELECT '{t}' AS topic, count() AS n FROM jitterscope.{table_of_topic[t]} FINAL WHERE host = {{h:String}}"
        for t in sorted(sent))
    result = run(["query", "-f", "json", sql, "-p", f"h={host}"], env)
    assert result.returncode == 0, result.stderr
    stored = {row["topic"]: int(row["n"]) for row in json.loads(result.stdout)}
    print(f"\nsent {sum(sent.values()):,} records ({sent}); {at_stop:,} runq stored at Ctrl-C, which took "
          f"{stop_s:.1f} s to exit; "
          f"undelivered {final.get('undelivered')}, spooled {final.get('spooled')}")
    assert stored == sent
    # the loss ledger agrees: the collector's last stats record counts every record it sent, itself included
    ledger = run(["ledger", "-f", "json", "--host", host], env)
    assert ledger.returncode == 0, ledger.stderr
    row = json.loads(ledger.stdout)[0]
    assert (row["sent"], row["stored"], row["unstored"]) == (sum(sent.values()), sum(sent.values()), 0), row
