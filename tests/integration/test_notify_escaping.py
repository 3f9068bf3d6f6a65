# SPDX-License-Identifier: Apache-2.0
"""Hostile process names reach no alert channel as markup (issue 40, item 9).

Two real processes name themselves as an attacker would: the victim
``<!channel>`` (Slack's ping-everyone mention) and the suspect
``<@U1>`` + newline + ``*forged*`` (a user mention and a forged line). Their
run-queue waits, with the names read back from /proc as the collector reads
them, go through Kafka and a real streams worker to local HTTP receivers
standing in for Alertmanager and a Slack incoming webhook. No body may carry
the markup; labels must be in the safe set; the text must be escaped as
Slack's formatting reference asks (``&lt;!channel&gt;``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from jitterscope.collector.publish import KafkaPublisher
from jitterscope.schemas import events, topics
from tests.conftest import wait_until
from tests.integration.test_notify import Receiver

pytestmark = pytest.mark.integration

VICTIM_NAME = "<!channel>"
SUSPECT_NAME = "<@U1>\n*forged*"  # 14 bytes: within the kernel's 15 for a comm
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# prctl(PR_SET_NAME): the kernel's own name of the process, what /proc and BPF report
NAMED = "import ctypes, sys, time\nctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\ntime.sleep(120)\n"


def named_process(name: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", NAMED, name])
    wait_until(lambda: Path(f"/proc/{proc.pid}/comm").read_text()[:-1] == name, 10, f"process named {name!r}")
    return proc


def comm_of(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text()[:-1]  # the kernel ends it with one newline


def publish_waits(stack, host: str, victim: int, suspect: int) -> None:
    """What the collector sends for a starved victim, a serving process (its
    waits are announced): its process record and run-queue waits over the
    alert threshold, with the names from /proc."""
    publisher = KafkaPublisher(stack.broker.bootstrap_servers, host)
    publisher.check_reachable()
    now = time.time_ns()
    head = lambda seq: dict(host=host, boot_id="escaping", seq=seq, ts_ns=now + seq)  # noqa: E731
    publisher.send(topics.TOPOLOGY, [events.Topology(**head(1), cpus=[0, 1], numa_nodes=[])])
    publisher.send(topics.PROCESSES, [events.ProcessInfo(**head(2), pid=victim, comm=comm_of(victim), cmdline="",
                                                         cgroup="/", cpus_allowed=[0], serving_group=victim)])
    publisher.flush()
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.processes WHERE host = {h:String}",
                                   h=host)[0][0] == 1, 60, "the victim's process record stored")
    publisher.send(topics.RUNQ, [events.RunqEvent(
        **head(10 + i), pid=victim, tid=victim, comm=comm_of(victim), cpu=0, wait_ns=25_000_000,
        suspect_pid=suspect, suspect_tid=suspect, suspect_comm=comm_of(suspect)) for i in range(5)])
    assert publisher.flush() == 0
    publisher.close()


def test_a_process_named_channel_pings_no_one(stack):
    receiver = Receiver()
    worker = stack.start_worker_with(
        JITTERSCOPE_ALERTMANAGER_URL=receiver.url, JITTERSCOPE_WEBHOOK_URL=f"{receiver.url}/hook",
        JITTERSCOPE_ALERT_GROUP_WINDOW_S="1", JITTERSCOPE_ALERT_GROUP_QUIET_S="2", JITTERSCOPE_RUNQ_ALERT_MS="10")
    victim, suspect = named_process(VICTIM_NAME), named_process(SUSPECT_NAME)
    host = f"escaping-{uuid.uuid4().hex[:6]}"
    try:
        publish_waits(stack, host, victim.pid, suspect.pid)

        def delivered():
            am = [a for body in receiver.bodies("/api/v2/alerts") for a in json.loads(body)
                  if a["labels"].get("host") == host]
            hook = [body for body in receiver.bodies("/hook") if host.encode() in body]
            return (am, hook) if am and hook else None

        am, hook = wait_until(delivered, 90, "alerts for the named victim at both receivers", worker)
    finally:
        for proc in (victim, suspect):
            proc.kill()
            proc.wait()
        worker.stop()
        receiver.server.shutdown()

    for path, body in receiver.raw:  # every byte any channel got
        assert b"<!channel>" not in body and b"<@U1>" not in body, (path, body[:300])
    for alert in am:
        assert alert["labels"]["comm"] == "&lt;!channel&gt;" and alert["labels"]["pid"] == str(victim.pid)
        assert alert["labels"]["suspect"] == "&lt;@U1&gt;\\x0a*forged*", "the newline forges no line"
        for part in ("labels", "annotations"):
            for name, value in alert[part].items():
                assert LABEL_NAME.fullmatch(name) and not name.startswith("__"), name
                assert value.isprintable() and not set(value) & set("<>"), (name, value)
                assert len(value) <= 2000, name
        assert "&lt;!channel&gt;" in alert["annotations"]["summary"]
    for body in hook:
        assert b"&lt;!channel&gt;" in body
        message = json.loads(body)
        assert "&lt;!channel&gt;" in message["text"] and not set(message["text"]) & set("<>")
        assert all(line.startswith("[") for line in message["text"].split("\n")), "one line per alert, no forged one"
        assert {item["alert"]["comm"] for item in message["alerts"]} == {VICTIM_NAME}, "the record stays whole"
