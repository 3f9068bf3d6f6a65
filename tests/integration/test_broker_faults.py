# SPDX-License-Identifier: Apache-2.0
"""The collector under broker faults, for real: Tansu (the embedded broker)
killed and restarted on the same port, or frozen with SIGSTOP, while spans
stream through a real collector (BPF loaded) and a real streams worker.

What can be promised. Tansu keeps data in memory only, so a killed broker
takes with it the records it had acknowledged and the worker had not read
yet: the collector counted them as sent and nobody can store them. The
promise is the rest: the collector recovers by itself, every record produced
after the broker died (retried in memory or from the spool) is stored, and
its own sent counts account for every record. A frozen broker loses nothing.

Every span carries a request ID, so each assertion names the missing ones.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request

import pytest

from jitterscope.broker import EmbeddedBroker, free_port
from jitterscope.schemas import events, topics
from jitterscope.streams.clickhouse import TABLE_OF
from tests.conftest import records_on_topic, wait_until

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

SPANS_PER_POST = 10
POST_EVERY_S = 0.05  # ~200 spans/s: a steady, countable stream


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """This module's own broker (the tests kill it), on a fixed port."""
    b = EmbeddedBroker(log_file=tmp_path_factory.mktemp("broker") / "tansu.log").start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def worker(stack):
    return stack.start_worker()


class SpanStream:
    """Posts request spans to the collector's OTLP receiver from a thread and
    remembers when each was accepted."""

    def __init__(self, port: int, prefix: str):
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        self.prefix = prefix
        self.accepted: list[tuple[str, float]] = []  # (request id, monotonic time accepted)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> "SpanStream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            ids = [f"{self.prefix}-{n + i}" for i in range(SPANS_PER_POST)]
            n += SPANS_PER_POST
            now = time.time_ns()
            spans = [{
                "traceId": f"{n + i:032x}", "spanId": f"{n + i + 1:016x}", "name": "llm_request", "kind": 2,
                "startTimeUnixNano": str(now - 5_000_000), "endTimeUnixNano": str(now),
                "attributes": [{"key": "gen_ai.request.id", "value": {"stringValue": rid}}],
            } for i, rid in enumerate(ids)]
            body = json.dumps({"resourceSpans": [{
                "resource": {"attributes": [{"key": "process.pid", "value": {"intValue": str(os.getpid())}}]},
                "scopeSpans": [{"spans": spans}]}]}).encode()
            request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    answer.read()
                at = time.monotonic()
                self.accepted += [(rid, at) for rid in ids]
            except OSError as exc:
                self.errors.append(repr(exc))
            self._stop.wait(POST_EVERY_S)


def start_collector(stack, host: str, otlp_port: int, metrics_port: int, **env: str):
    collector = stack.start_collector(
        **env, JITTERSCOPE_HOST=host, JITTERSCOPE_OTLP_PORT=str(otlp_port),
        JITTERSCOPE_COLLECTOR_METRICS_PORT=str(metrics_port), JITTERSCOPE_HISTOGRAM_INTERVAL_S="1",
        JITTERSCOPE_TARGET_COMMS='["no-such-process"]', JITTERSCOPE_HARDWARE_PROBES="[]")
    # by its port, not its log: collectors of this module share one log file
    wait_until(lambda: port_open(otlp_port), 90, "OTLP receiver", collector)
    return collector


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def sent_metric(port: int, topic: str) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return -1
    name = f'jitterscope_collector_records_sent_total{{topic="{topic}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def stored_ids(stack, host: str) -> set[str]:
    return {r[0] for r in stack.query(
        "SELECT request_id FROM jitterscope.requests FINAL WHERE host = {h:String}", h=host)}


def attributed_ids(stack, host: str) -> set[str]:
    return {r[0] for r in stack.query(
        "SELECT request_id FROM jitterscope.request_attribution WHERE host = {h:String}", h=host)}


def stored_stats(stack, host: str) -> list[tuple[int, int]]:
    """(seq, creation time in ns) of the host's stored stats records, by seq."""
    return [tuple(r) for r in stack.query(
        "SELECT seq, toUnixTimestamp64Nano(ts) FROM jitterscope.collector_stats FINAL WHERE host = {h:String} "
        "ORDER BY seq", h=host)]


def stored_by_topic(stack, host: str) -> dict[str, int]:
    out = {}
    for topic, kind in topics.INPUT_TOPICS.items():
        table = TABLE_OF[kind]
        out[topic] = stack.query(f"SELECT count() FROM jitterscope.{table} FINAL WHERE host = {{h:String}}",
                                 h=host)[0][0]
    return out


def final_counts(stack, collector) -> dict:
    assert collector.stop(60) == 0, collector.text()[-3000:]
    final = json.loads((stack.data_dir / "collector-final.json").read_text())
    return final


def test_broker_killed_and_restarted_on_the_same_port(stack, broker, worker):
    kill_and_restart(stack, broker, worker, "faults-restart")


def test_idempotent_producer_stuck_after_a_restart_is_recreated(stack, broker, worker):
    """Forced idempotence on a broker that forgets producer ids (what a real
    Kafka losing its state looks like): librdkafka loops silently on
    UNKNOWN_PRODUCER_ID; the collector sees no progress, recreates the
    producer and re-sends."""
    restarts = kill_and_restart(stack, broker, worker, "faults-idempotent", JITTERSCOPE_KAFKA_IDEMPOTENCE="true")
    assert restarts >= 1


def kill_and_restart(stack, broker, worker, host: str, **env: str) -> int:
    otlp_port, metrics_port = free_port(), free_port()
    collector = start_collector(stack, host, otlp_port, metrics_port, **env)
    with SpanStream(otlp_port, "restart") as stream:
        wait_until(lambda: sent_metric(metrics_port, topics.REQUESTS) > 500, 60, "spans flowing", collector)
        # under load: the broker dies with whatever it held
        broker.proc.kill()
        broker.proc.wait()
        killed_at, killed_ns = time.monotonic(), time.time_ns()
        wait_until(lambda: len([1 for _, t in stream.accepted if t > killed_at]) >= 600, 60,
                   "spans accepted while the broker is down", collector)
        sent_at_kill = sent_metric(metrics_port, topics.REQUESTS)  # the metric lags by up to 1 s
        broker.start()  # same port, empty: topics are created again
        restarted_at = time.monotonic()
        wait_until(lambda: sent_metric(metrics_port, topics.REQUESTS) > sent_at_kill, 120,
                   "the collector acknowledged again", collector)
        recovered_s = time.monotonic() - restarted_at
        first_after = wait_until(lambda: next((rid for rid, t in stream.accepted if t > restarted_at + 0.5), None),
                                 30, "a span accepted after the restart")
        wait_until(lambda: first_after in stored_ids(stack, host), 90,
                   "a span sent after the restart stored", worker)
        stored_s = time.monotonic() - restarted_at
        wait_until(lambda: len([1 for _, t in stream.accepted if t > restarted_at]) >= 600, 60,
                   "load after the restart", collector)
    # a recreated producer re-sends a whole outage's backlog: let it be
    # acknowledged before stopping (a stop mid-backlog spools the rest, by design)
    accepted = len(stream.accepted)
    wait_until(lambda: sent_metric(metrics_port, topics.REQUESTS) >= accepted, 120,
               f"the collector acknowledged for all {accepted} spans", collector)
    stopping_ns = time.time_ns()
    final = final_counts(stack, collector)

    posted = dict(stream.accepted)
    assert not stream.errors, stream.errors[:5]
    assert final["host"] == host and final["undelivered"] == 0 and final["spooled"] == 0
    # the collector accounts for every span: each one acknowledged, once
    assert final["sent_by_topic"][topics.REQUESTS] == len(posted)
    after_kill = {rid for rid, t in posted.items() if t > killed_at}
    try:
        stored = wait_until(lambda: (ids := stored_ids(stack, host)) >= after_kill and ids, 90,
                            "every span accepted after the broker died stored", worker)
    except AssertionError:
        missing = sorted(after_kill - stored_ids(stack, host), key=lambda rid: posted[rid])
        when = [round(posted[rid] - restarted_at, 1) for rid in (missing[0], missing[-1])]
        raise AssertionError(
            f"{len(missing)} of {len(after_kill)} spans sent after the kill were acknowledged by the new broker "
            f"(the collector counted all {len(posted)}) but never stored; accepted from {when[0]}s to {when[1]}s "
            f"after the restart. The worker skipped them (offsets of the dead broker committed to the new one?)"
        ) from None
    lost = sorted(set(posted) - stored)
    # what is missing was acknowledged by the dead broker and died with it
    assert all(posted[rid] <= killed_at for rid in lost), lost[:10]
    assert len(lost) <= sent_at_kill
    counts = stored_by_topic(stack, host)
    assert all(counts[t] <= n for t, n in final["sent_by_topic"].items())
    stats_sent = final["sent_by_topic"][topics.COLLECTOR_STATS]
    stats = wait_until(lambda: (rows := stored_stats(stack, host)) and rows[-1][1] >= stopping_ns and rows, 60,
                       "the last stats record (sent on stop) stored", worker)
    # A stats record is a record like any other: the dead broker may take the
    # latest one with it (the worker lags a little on a busy box). Seqs count
    # up by one per stats record, so those missing are known exactly; each
    # must have been sent before the kill: below every record made after it.
    seqs = [seq for seq, _ in stats]
    missing = sorted(set(range(seqs[-1] - stats_sent + 1, seqs[-1] + 1)) - set(seqs))
    first_after_kill = next(seq for seq, ts in stats if ts > killed_ns)
    assert all(seq < first_after_kill for seq in missing), (missing, first_after_kill, stats)
    # what the worker publishes after the restart reaches the new broker, even
    # what it refused in its first moments (UnknownError until the producer's
    # metadata catches up): each request that reached the worker through the
    # new broker has its attribution on the new broker's topic
    wait_until(lambda: attributed_ids(stack, host) >= after_kill, 90, "every span sent after the kill attributed",
               worker)
    on_topic = {a.request_id for a in records_on_topic(broker.bootstrap_servers, topics.ATTRIBUTION,
                                                       events.RequestAttribution) if a.host == host}
    unpublished = sorted(after_kill - on_topic, key=lambda rid: posted[rid])
    assert not unpublished, (len(unpublished), len(after_kill), unpublished[:5])
    restarts = stack.query("SELECT max(producer_restarts) FROM jitterscope.collector_stats WHERE host = {h:String}",
                           h=host)[0][0]
    print(f"\n[measured] broker kill+restart: {len(posted)} spans, {len(lost)} lost with the dead broker "
          f"(acknowledged before the kill, not yet read) and {len(missing)} stats records, "
          f"0 of {len(after_kill)} sent after the kill lost or unpublished; collector acknowledging again {recovered_s:.1f}s after the restart, "
          f"stored end to end after {stored_s:.1f}s; producer restarts {restarts}; "
          f"sent {final['sent_by_topic']} stored {counts}")
    return restarts


def test_broker_frozen_for_20s_loses_nothing(stack, broker, worker):
    host = "faults-sigstop"
    otlp_port, metrics_port = free_port(), free_port()
    collector = start_collector(stack, host, otlp_port, metrics_port)
    with SpanStream(otlp_port, "stop") as stream:
        wait_until(lambda: sent_metric(metrics_port, topics.REQUESTS) > 500, 60, "spans flowing", collector)
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            wait_until(lambda: time.monotonic() - stopped_at >= 20, 30, "20 s of frozen broker", collector)
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        sent_then = sent_metric(metrics_port, topics.REQUESTS)
        wait_until(lambda: sent_metric(metrics_port, topics.REQUESTS) > sent_then, 60,
                   "acknowledged again", collector)
        recovered_s = time.monotonic() - resumed_at
        wait_until(lambda: len([1 for _, t in stream.accepted if t > resumed_at]) >= 400, 60,
                   "load after the freeze", collector)
    final = final_counts(stack, collector)
    posted = {rid for rid, _ in stream.accepted}
    assert not stream.errors, stream.errors[:5]
    assert final["undelivered"] == 0 and final["spooled"] == 0
    assert final["sent_by_topic"][topics.REQUESTS] == len(posted)
    wait_until(lambda: stored_ids(stack, host) == posted, 90, "every span stored", worker)
    expected = {t: n for t, n in final["sent_by_topic"].items()}
    counts = wait_until(lambda: (c := stored_by_topic(stack, host)) == {**c, **expected} and c, 90,
                        "every record the collector sent stored, per topic", worker)
    print(f"\n[measured] broker SIGSTOP 20 s: {len(posted)} spans, 0 lost; collector acknowledging again "
          f"{recovered_s:.1f}s after SIGCONT; sent = stored per topic: {counts}")
