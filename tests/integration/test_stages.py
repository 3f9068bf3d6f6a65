# SPDX-License-Identifier: Apache-2.0
"""The pipeline in stages (streams/stages.py), with a real broker and chDB:
the judge and the store run as separate processes in their own consumer
groups; run-queue alerts reach the alerts topic while the store process is
stopped (SIGSTOP: a real stall, not a slow mock), and once it runs again
every alert, folded ones included, is stored once; a restarted judge knows
its hosts again from the topics, without ClickHouse."""

from __future__ import annotations

import os
import signal
import urllib.request
import uuid

import pytest

from jitterscope.broker import free_port
from jitterscope.schemas import events, topics
from tests.conftest import Proc, records_on_topic, wait_until
from tests.integration.test_streams_faults import example, lines, send

pytestmark = pytest.mark.integration

VICTIM = 4242


def runq(host: str, seq: int, suspect: str) -> dict:
    return {**example(events.RunqEvent, host, seq), "pid": VICTIM, "tid": VICTIM, "comm": "engine",
            "wait_ns": 30_000_000, "suspect_pid": 7000 + seq, "suspect_comm": suspect}


def start_judge(stack, port: int) -> Proc:
    judge = stack.spawn("judge", "streams", "--stage", "judge", JITTERSCOPE_JUDGE_WEB_PORT=str(port))
    wait_until(lambda: metrics(port) is not None, 90, f"judge answering on {port}", judge)
    return judge


def metrics(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None


def announced(stack, host: str) -> list[events.Alert]:
    return [a for a in records_on_topic(stack.broker.bootstrap_servers, topics.ALERTS, events.Alert) if a.host == host]


def stored(stack, host: str) -> tuple[int, int]:
    """(rows, distinct alert events) of the host's alerts in the store."""
    return tuple(stack.query("SELECT count(), uniqExact(kind, seq) FROM jitterscope.alerts FINAL "
                             "WHERE host = {h:String}", h=host)[0])


def test_alerts_flow_while_the_store_is_stopped_and_are_all_stored_once_after(stack):
    host, judge_port = f"staged-{uuid.uuid4().hex[:8]}", free_port()
    store = stack.spawn("streams", "streams", "--stage", "store")
    wait_until(stack.query_ok, 90, "the store stage answering /query", store)
    judge = start_judge(stack, judge_port)
    send(stack.broker, topics.TOPOLOGY, host, lines(example(events.Topology, host, 1)))
    send(stack.broker, topics.PROCESSES, host,
         lines({**example(events.ProcessInfo, host, 1), "pid": VICTIM, "comm": "engine", "serving_group": VICTIM}))
    send(stack.broker, topics.RUNQ, host, lines(runq(host, 10, "first")))
    wait_until(lambda: stored(stack, host) == (1, 1), 120, "the first alert stored through the judge", judge)

    os.kill(store.popen.pid, signal.SIGSTOP)  # the store (and its attribution) stalls for real
    try:
        # five new suspects (five groups, each announced) and five repeats of one (folded, stored only)
        send(stack.broker, topics.RUNQ, host, lines(*(runq(host, 20 + i, f"hog{i}") for i in range(5))))
        send(stack.broker, topics.RUNQ, host, lines(*(runq(host, 30 + i, "hog0") for i in range(5))))
        seen = wait_until(lambda: (a := announced(stack, host)) and len(a) >= 6 and a, 120,
                          "alerts announced while the store is stopped", judge)
        assert open(f"/proc/{store.popen.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", "still stopped"
        assert {a.suspect_comm for a in seen} == {"first", *(f"hog{i}" for i in range(5))}
    finally:
        os.kill(store.popen.pid, signal.SIGCONT)
    wait_until(lambda: stored(stack, host) == (11, 11), 180, "every alert row stored once, folded included", store)
    folded = stack.query("SELECT count() FROM jitterscope.alerts FINAL WHERE host = {h:String} "
                         "AND evidence['state'] = 'folded'", h=host)[0][0]
    assert folded == 5

    # a restarted judge learns the host again from the topics: the victim is named at once, not parked
    assert judge.stop() == 0
    judge = start_judge(stack, judge_port)
    send(stack.broker, topics.RUNQ, host, lines(runq(host, 40, "after-restart")))
    wait_until(lambda: stored(stack, host) == (12, 12), 120, "the restarted judge's alert stored", judge)
    [[comm]] = stack.query("SELECT comm FROM jitterscope.alerts FINAL WHERE host = {h:String} AND seq = 40", h=host)
    assert comm == "engine"
    text = metrics(judge_port)
    assert 'jitterscope_streams_loop_lag_seconds_count{stage="judge"}' in text
    # every run-queue message the judge took, aged from its producer's timestamp
    [aged] = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(
        f'jitterscope_streams_message_age_seconds_count{{stage="judge",topic="{topics.RUNQ}"}}')]
    assert aged >= 1, text
    assert "jitterscope_streams_runq_parked_total 0.0" in text, "judged at once: its process was known"
    judge.stop()
    store.stop()
