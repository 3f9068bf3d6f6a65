# SPDX-License-Identifier: Apache-2.0
"""Span pid forgery, for real (issue 40, item 6): the OTLP receiver listens
on a non-loopback address (the host's end of a veth pair, as the DaemonSet's
receiver listens on the node IP), and a process run as ``nobody`` sends it a
span whose resource claims ``process.pid`` of a root process (a ``sleep``)
it has nothing to do with.

- From another network namespace (a pod's, here `ip netns` + veth): its
  socket is found in that namespace's tables, so the sender is known: the
  claim is refused and the span charged to the sender, never to the sleep.
- From this namespace, to the same address or over loopback: the same.
- To a receiver that cannot see the sender's process at all (its own PID
  namespace and /proc, as a collector in a pod without hostPID; to it the
  sender is another host's): the claim is ignored, the span kept at host
  level (pid 0) and counted ``unverified_claim``.
- From an address configured as a relay (``otlp_trusted_relays``, an
  OpenTelemetry Collector's): the claim is honoured.

Needs root (network namespaces, setpriv)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import pytest
from prometheus_client import REGISTRY

from jitterscope.collector.otlp import OtlpReceiver
from tests.conftest import wait_until
from tests.fixtures.otlp_builder import export, with_id
from tests.netns import namespaces_on_a_bridge

pytestmark = pytest.mark.integration

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# stdlib only: it runs as nobody under the system's Python. It prints its
# pid (its host pid: only its network namespace is its own) and the answer.
POSTER = textwrap.dedent("""
    import http.client, os, sys
    body = sys.stdin.buffer.read()
    conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=60)
    conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
    answer = conn.getresponse()
    answer.read()
    print(os.getpid(), answer.status, flush=True)
""")

# The receiver in its own PID namespace with its own /proc: no process of
# the test's is in it. It prints its port, then each record and the count
# of ignored claims so far.
HIDDEN_RECEIVER = textwrap.dedent("""
    import json, sys
    from prometheus_client import REGISTRY
    from jitterscope.collector.otlp import OtlpReceiver
    def out(records):
        ignored = REGISTRY.get_sample_value("jitterscope_otlp_pid_resolved_total", {"how": "unverified_claim"})
        for r in records:
            print(json.dumps({"request_id": r["request_id"], "pid": r["pid"], "ignored": ignored}), flush=True)
    receiver = OtlpReceiver(sys.argv[1], 0, out, trusted_relays=json.loads(sys.argv[2])).start()
    print(receiver.port, flush=True)
    sys.stdin.read()
""")


def how(name: str) -> float:
    return REGISTRY.get_sample_value("jitterscope_otlp_pid_resolved_total", {"how": name}) or 0.0


@pytest.fixture(scope="module")
def network():
    with namespaces_on_a_bridge(1) as ns:
        yield ns


@pytest.fixture(scope="module")
def victim():
    """A root process the sender has nothing to do with."""
    sleep = subprocess.Popen(["sleep", "600"])
    yield sleep.pid
    sleep.kill()
    sleep.wait(30)


@contextmanager
def receiving(host: str, relays: list[str] = ()):
    got: list[dict] = []
    with OtlpReceiver(host, 0, got.extend, trusted_relays=relays) as receiver:
        yield receiver, got


def post_as_nobody(prefix: list[str], host: str, port: int, request_id: str, claimed: int) -> int:
    """One span claiming ``claimed``, posted as nobody; the poster's pid."""
    body = export(with_id(request_id), pid=claimed).SerializeToString()
    done = subprocess.run([*prefix, *AS_NOBODY, "/usr/bin/python3", "-c", POSTER, host, str(port)],
                          input=body, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    pid, status = done.stdout.decode().split()
    assert status == "200"
    return int(pid)


def record(got: list[dict], request_id: str) -> dict:
    found = wait_until(lambda: [g for g in got if g["request_id"] == request_id], 30, f"the span {request_id}")
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("where", ["other netns", "this netns", "loopback"])
def test_a_forged_pid_is_charged_to_its_sender(network, victim, where):
    prefix = network.prefix(0) if where == "other netns" else []
    host = "127.0.0.1" if where == "loopback" else network.bridge_ip
    request_id = f"forged-{secrets.token_hex(4)}"
    before = how("refused_claim")
    with receiving(host) as (receiver, got):
        sender = post_as_nobody(prefix, host, receiver.port, request_id, victim)
        span = record(got, request_id)
    assert sender != victim and span["pid"] == sender, (where, span, sender, victim)
    assert how("refused_claim") == before + 1


def test_an_unseen_sender_s_claim_is_ignored(network, victim):
    request_id = f"unseen-{secrets.token_hex(4)}"
    receiver = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c", HIDDEN_RECEIVER,
         network.bridge_ip, "[]"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline() or 0)
        assert port, receiver.stderr.read()
        post_as_nobody(network.prefix(0), network.bridge_ip, port, request_id, victim)
        span = json.loads(receiver.stdout.readline())
    finally:
        receiver.kill()
        receiver.wait(30)
    assert (span["request_id"], span["pid"], span["ignored"]) == (request_id, 0, 1.0)


def test_a_relay_s_claim_is_honoured(network, victim):
    """The namespace's address is configured as a relay (an OpenTelemetry
    Collector's): the span is charged to the process it names."""
    relay = network.bridge_ip.rsplit(".", 1)[0] + ".2"  # namespace 0's address (tests/netns.py)
    request_id = f"relayed-{secrets.token_hex(4)}"
    with receiving(network.bridge_ip, [relay]) as (receiver, got):
        post_as_nobody(network.prefix(0), network.bridge_ip, receiver.port, request_id, victim)
        span = record(got, request_id)
    assert span["pid"] == victim
    assert os.path.exists(f"/proc/{victim}")
