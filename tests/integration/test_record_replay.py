"""Record and replay without the kernel: a recording written through the
collector's file sink, replayed twice into a real broker and streams worker,
is stored once and raises the alerts its run-queue waits call for. The fast
regression test for the rules (issue 9, part 7)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from jitterscope.collector.recording import RecordingPublisher, summarize
from jitterscope.schemas import events, topics
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

VICTIM, SUSPECT = 4242, 777
ALERTING = 6  # waits of 15 ms (>= runq_alert_ms, 10 by default)
QUIET = 9  # waits of 2 ms: stored, no alert


def make_recording(path, host: str) -> dict[str, int]:
    """A starvation incident as the collector would have recorded it."""
    now = time.time_ns()
    head = lambda seq, offset=0: dict(host=host, boot_id="boot-rr", seq=seq, ts_ns=now + offset)  # noqa: E731
    topology = events.Topology(**head(1), cpus=[0, 1, 2, 3],
                               numa_nodes=[events.NumaNode(node=0, cpus=[0, 1, 2, 3], memory_bytes=1 << 34)])
    process = events.ProcessInfo(**head(1), pid=VICTIM, comm="vllm-engine", cmdline="python -m vllm serve",
                                 cgroup="/system.slice/vllm.service", cpus_allowed=[0, 1])
    waits = [15_000_000] * ALERTING + [2_000_000] * QUIET
    runq = [events.RunqEvent(**head(100 + i, i * 1_000_000), pid=VICTIM, tid=VICTIM + 1, comm="vllm-engine",
                             cpu=i % 2, wait_ns=wait, suspect_pid=SUSPECT, suspect_tid=SUSPECT, suspect_comm="backup-tar")
            for i, wait in enumerate(waits)]
    publisher = RecordingPublisher(path, host, max_records=4)  # several messages on the runq topic
    publisher.check_reachable()
    publisher.send(topics.TOPOLOGY, [topology])
    publisher.send(topics.PROCESSES, [process])
    publisher.send(topics.RUNQ, runq)
    publisher.flush()
    publisher.close()
    return dict(publisher.sent_by_topic)


def replay(stack, path) -> str:
    done = subprocess.run([sys.executable, "-m", "jitterscope.cli", "replay", str(path)], env=stack.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_recording_replayed_twice_is_stored_once_and_raises_its_alerts(stack, tmp_path):
    host = f"rr-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "incident.jsrec.gz"
    recorded = make_recording(path, host)
    assert recorded == {topics.TOPOLOGY: 1, topics.PROCESSES: 1, topics.RUNQ: ALERTING + QUIET}
    summary = summarize(path)
    assert summary.by_topic == recorded and summary.hosts == {host} and not summary.truncated

    worker = stack.start_worker()
    first = replay(stack, path)
    assert f"replayed {ALERTING + QUIET + 2} records" in " ".join(first.split())
    replay(stack, path)

    tables = {"topology": 1, "processes": 1, "runq_events": ALERTING + QUIET}
    count = lambda table: stack.query(  # noqa: E731
        f"SELECT count(), uniqExact(boot_id, seq) FROM jitterscope.{table} FINAL WHERE host = {{h:String}}", h=host)
    for table, expected in tables.items():
        wait_until(lambda: count(table) == [[expected, expected]], 90, f"{expected} {table} rows", worker)

    alerts = wait_until(
        lambda: (rows := stack.query(
            "SELECT seq, pid, suspect_pid, suspect_comm, cpus_allowed, summary, remedy FROM jitterscope.alerts FINAL "
            "WHERE host = {h:String} AND kind = 'runq_starvation' ORDER BY seq", h=host)) and len(rows) >= ALERTING
        and rows, 60, f"{ALERTING} runq_starvation alerts", worker)
    assert [a[0] for a in alerts] == list(range(100, 100 + ALERTING))  # once each, only the 15 ms waits
    for _seq, pid, suspect_pid, suspect_comm, cpus_allowed, summary_text, remedy in alerts:
        assert (pid, suspect_pid, suspect_comm) == (VICTIM, SUSPECT, "backup-tar")
        assert list(cpus_allowed) == [0, 1]  # the ProcessInfo record was joined
        assert "backup-tar" in summary_text and f"taskset -apc 2-3 {SUSPECT}" in remedy  # the Topology too

    # every replayed message went through: the duplicates are there before FINAL folds them
    raw = stack.query("SELECT count() FROM jitterscope.runq_events WHERE host = {h:String}", h=host)[0][0]
    assert ALERTING + QUIET <= raw <= 2 * (ALERTING + QUIET)
    print(f"round trip: recorded {summary.records} records {summary.by_topic}; replayed twice; stored FINAL "
          f"{ {t: count(t)[0][0] for t in tables} } (runq rows before FINAL: {raw}); alerts {len(alerts)}")
    assert worker.popen.poll() is None
