# SPDX-License-Identifier: Apache-2.0
"""collector/otlp/pids.py: which process sent a span.

The loopback peer's pid from captured /proc/net/tcp{,6} tables and from a
real connection; the host pid of a resource's ``process.pid`` translated
from a container's PID namespace (tests/fixtures/host-containers); and who
may speak for whom: a sender's claim beyond its own container, pod or
cgroup is refused and charged to the sender, unless it is a trusted relay
(named by ``comm`` or, safer, by executable path, or by the address it
sends from); a sender not on this host and no relay by address has its
claims ignored (host level, counted). The real network namespace:
tests/integration/test_span_forgery.py."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
from pathlib import Path

import pytest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from jitterscope.collector.otlp.convert import PROTOBUF, spans_to_requests
from jitterscope.collector.otlp.pids import PidResolver, pid_of_peer
from jitterscope.collector.otlp.server import OtlpReceiver
from tests.fixtures.otlp_builder import (
    FIXTURES, ROOT, attrs, export, metric, post, receiver, with_id)  # noqa: F401 - receiver: a fixture


# -- which process sent it --------------------------------------------------

@pytest.fixture
def fake_proc(tmp_path):
    """The captured socket tables plus /proc/<pid>/fd links to their inodes."""
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", proc)
    holders = {"100": ["socket:[1000]", "socket:[2001]", "/dev/null"],  # the collector
               "4242": ["socket:[2002]"], "4343": ["socket:[4001]"], "4444": ["/dev/null", "socket:[5001]"],
               "4545": ["pipe:[77]", "socket:[6001]"]}
    for pid, targets in holders.items():
        (proc / pid / "fd").mkdir(parents=True)
        for fd, target in enumerate(targets):
            (proc / pid / "fd" / str(fd)).symlink_to(target)
    (proc / "5555").mkdir()  # no fd directory to read (gone, or not ours)
    (proc / "self").symlink_to("100")
    return proc


@pytest.mark.parametrize("peer_host, peer_port, local_port, pid", [
    ("127.0.0.1", 41394, 4318, 4242),
    ("::ffff:127.0.0.1", 41394, 4318, 4242),  # a dual-stack server sees IPv4 peers mapped
    ("::1", 42000, 4318, 4343),
    ("127.0.0.1", 43000, 4318, 4444),  # the client's IPv6 socket, connected to a mapped address
    ("127.0.0.2", 45056, 4318, 4545),  # all of 127/8 is loopback
    ("127.0.0.1", 41000, 4318, None),  # TIME_WAIT: no process holds it
    ("10.0.0.5", 50000, 4318, None),  # another host
    ("127.0.0.1", 41394, 9999, None),  # not a connection to us
    ("127.0.0.3", 41394, 4318, None),
    ("not an address", 41394, 4318, None),
])
def test_pid_of_peer_in_a_fake_proc(fake_proc, peer_host, peer_port, local_port, pid):
    assert pid_of_peer(peer_host, peer_port, local_port, fake_proc) == pid


def test_pid_of_peer_without_proc_net(tmp_path):
    assert pid_of_peer("127.0.0.1", 41394, 4318, tmp_path) is None


def test_pid_of_peer_on_a_real_loopback_connection():
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        conn, (peer_host, peer_port) = server.accept()
        with conn:
            assert peer_port == client.getsockname()[1]
            assert pid_of_peer(peer_host, peer_port, server.getsockname()[1]) == os.getpid()


# -- pids of senders in containers (tests/fixtures/host-containers) ----------

CPROC = ROOT / "tests" / "fixtures" / "host-containers" / "proc"
RELAY_ADDRESS = "192.0.2.7"  # an OpenTelemetry Collector on another host, trusted by address
DOCKER_ID = "3f4b8c2e1d0a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"
POD1 = "7d1e2c3b-4a5f-4e6d-9c8b-1a2b3c4d5e6f"


def resource(**attributes) -> Resource:
    return Resource(attributes=attrs({k.replace("__", "."): v for k, v in attributes.items()}))


@pytest.mark.parametrize("attributes, peer, answer", [
    # container.id / k8s.pod.uid: process.pid is the container's, translated through NSpid
    ({"process__pid": 7, "container__id": DOCKER_ID}, None, (2002, "nspid")),
    # from a host process that is no trusted relay (see test_a_named_relay_speaks_for_others)
    ({"process__pid": 7, "container__id": DOCKER_ID}, 1, (1, "refused_claim")),
    ({"process__pid": 1, "k8s__pod__uid": POD1}, None, (3001, "container")),  # two pid 1s in the pod
    ({"container__id": DOCKER_ID}, None, (2001, "container")),
    ({"process__pid": 7, "container__id": "0" * 64}, None, (0, "unresolved")),  # never the raw pid
    # the connection's process is in a container
    ({"process__pid": 7}, 2002, (2002, "peer_nspid")),
    ({"process__pid": 1}, 2002, (2001, "nspid")),  # another process of the sender's cgroup
    ({"process__pid": 99}, 2002, (0, "unresolved")),
    # on the host, as before
    ({"process__pid": 4242}, None, (4242, "process_pid")),
    ({"process__pid": 1}, 1, (1, "process_pid")),
    ({"process__pid": 4242}, 1, (1, "refused_claim")),  # no trusted relay: charged to itself
    ({}, 555, (555, "peer")),
    ({}, None, (0, "unresolved")),
])
def test_pid_resolver(attributes, peer, answer):
    """``peer`` None: a relay elsewhere (by address), whose resource speaks for itself."""
    hints = []
    resolver = PidResolver(CPROC, trusted_relays=[RELAY_ADDRESS])
    peer_host = RELAY_ADDRESS if peer is None else "127.0.0.1"
    assert resolver.resolve(resource(**attributes), lambda hint: hints.append(hint) or peer, peer_host) == answer
    assert hints == [attributes.get("process__pid")]  # the claimed pid is the scan's first guess


def test_pid_resolver_forgets_a_process_that_exited(tmp_path):
    proc = tmp_path / "proc"
    shutil.copytree(CPROC, proc)
    resolver = PidResolver(proc, snapshot_s=0, trusted_relays=[RELAY_ADDRESS])
    span_resource = resource(process__pid=7, container__id=DOCKER_ID)
    assert resolver.resolve(span_resource, lambda hint: None, RELAY_ADDRESS) == (2002, "nspid")
    shutil.rmtree(proc / "2002")
    assert resolver.resolve(span_resource, lambda hint: None, RELAY_ADDRESS) == (2001, "container")


def test_resolved_pids_are_counted_per_request():
    def resolve(res):
        return PidResolver(CPROC, trusted_relays=[RELAY_ADDRESS]).resolve(res, lambda hint: None, RELAY_ADDRESS)

    before = metric("jitterscope_otlp_pid_resolved_total", how="nspid")
    request = export(with_id("a"), with_id("b", span_id=b"\x01" * 8), with_id("c", span_id=b"\x02" * 8, parent=b"\x03" * 8))
    request.resource_spans[0].resource.CopyFrom(resource(process__pid=7, container__id=DOCKER_ID))
    records, _, _ = spans_to_requests(request, resolve_pid=resolve)
    assert {r["pid"] for r in records} == {2002} and len(records) == 3
    assert metric("jitterscope_otlp_pid_resolved_total", how="nspid") == before + 3


def test_an_unknown_sender_s_claim_over_http_is_ignored():
    """proc is the fixture: the connection's owner is not in it (as a sender
    on another host): its claim to be a container's process is ignored, the
    span kept at host level."""
    got: list[dict] = []
    before = metric("jitterscope_otlp_pid_resolved_total", how="unverified_claim")
    request = export(with_id("from-elsewhere"))
    request.resource_spans[0].resource.CopyFrom(
        resource(service__name="vllm", process__pid=7, container__id=DOCKER_ID))
    with OtlpReceiver("127.0.0.1", 0, got.extend, proc=CPROC) as r:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        conn.request("POST", "/v1/traces", request.SerializeToString(), {"Content-Type": PROTOBUF})
        assert conn.getresponse().status == 200
        conn.close()
    assert [(g["request_id"], g["pid"]) for g in got] == [("from-elsewhere", 0)]
    assert metric("jitterscope_otlp_pid_resolved_total", how="unverified_claim") == before + 1


@pytest.mark.parametrize("attributes, answer", [
    ({"process__pid": 1}, (0, "unverified_claim")),
    ({"process__pid": 7, "container__id": DOCKER_ID}, (0, "unverified_claim")),
    ({"process__pid": 1, "k8s__pod__uid": POD1}, (0, "unverified_claim")),
    ({"container__id": DOCKER_ID}, (0, "unverified_claim")),
    ({}, (0, "unresolved")),
])
@pytest.mark.parametrize("relays, peer_host", [
    ([], "10.0.0.5"), (["otelcol-contrib", "/usr/bin/otelcol-contrib"], "10.0.0.5"),
    (["10.0.0.0/30"], "10.0.0.5"), (["10.0.0.4/30"], None), (["fd00::/64"], "fd01::5")])
def test_a_sender_not_on_this_host_and_no_relay_speaks_for_nobody(relays, peer_host, attributes, answer):
    resolver = PidResolver(CPROC, trusted_relays=relays)
    assert resolver.resolve(resource(**attributes), lambda hint: None, peer_host) == answer


@pytest.mark.parametrize("peer_host", ["10.0.0.5", "::ffff:10.0.0.5", "fd00::5"])
def test_a_relay_by_address_speaks_for_others(peer_host):
    resolver = PidResolver(CPROC, trusted_relays=["otelcol", "10.0.0.4/30", "fd00::/64"])
    claim = resource(process__pid=7, container__id=DOCKER_ID)
    assert resolver.resolve(claim, lambda hint: None, peer_host) == (2002, "nspid")
    assert resolver.resolve(claim, lambda hint: 1, peer_host) == (2002, "nspid")  # known, and the relay's address


@pytest.mark.parametrize("entry", ["127.0.0.1", "127.0.0.0/8", "0.0.0.0/0", "0.0.0.0", "::1", "::/0", "::"])
def test_a_relay_address_every_local_process_sends_from_is_refused(entry):
    with pytest.raises(ValueError, match="loopback"):
        PidResolver(CPROC, trusted_relays=["otelcol", entry])


def test_a_flood_of_unknown_containers_scans_proc_once(monkeypatch):
    """An export may carry thousands of resources: /proc is scanned at most
    once per snapshot period, whatever the senders claim."""
    from jitterscope.collector import hostinfo
    scans = []
    real = hostinfo.ns_processes
    monkeypatch.setattr(hostinfo, "ns_processes", lambda proc: scans.append(proc) or real(proc))
    resolver = PidResolver(CPROC, snapshot_s=60, trusted_relays=[RELAY_ADDRESS])
    answers = {resolver.resolve(resource(process__pid=7, container__id=f"{i:064x}"), lambda hint: None, RELAY_ADDRESS)
               for i in range(2000)}
    assert answers == {(0, "unresolved")} and len(scans) == 1
    # short IDs and the kubelet's "containerd://" spelling find the container in that same scan
    assert resolver.resolve(resource(process__pid=7, container__id=DOCKER_ID[:12]), lambda hint: None,
                            RELAY_ADDRESS) == (2002, "nspid")
    assert resolver.resolve(resource(process__pid=1, container__id="containerd://" + DOCKER_ID.upper()),
                            lambda hint: None, RELAY_ADDRESS) == (2001, "nspid")
    assert len(scans) == 1


# -- who may speak for whom --------------------------------------------------

RELAY_EXE = "/usr/bin/otelcol-contrib"


def add_process(proc: Path, pid: int, comm: str, exe: str, cgroup: str, uid: int = 0, nspid: str = "") -> None:
    """A process in a fixture /proc: status (NSpid), comm, cgroup, exe."""
    status = (CPROC / "1" / "status").read_text().replace("systemd", comm)
    for name, value in (("Tgid", pid), ("Pid", pid), ("NStgid", nspid or pid), ("NSpid", nspid or pid),
                        ("Uid", f"{uid}\t{uid}\t{uid}\t{uid}")):
        status = "\n".join(f"{name}:\t{value}" if line.startswith(f"{name}:") else line
                           for line in status.splitlines()) + "\n"
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "status").write_text(status)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "exe").symlink_to(exe)


@pytest.fixture
def senders_proc(tmp_path):
    """host-containers plus an OpenTelemetry Collector (900, root), an
    unprivileged process (901, uid 65534) and one that calls itself
    otelcol-contrib (902, uid 65534), all on the host."""
    proc = tmp_path / "proc"
    shutil.copytree(CPROC, proc)
    add_process(proc, 900, "otelcol-contrib", RELAY_EXE, "0::/system.slice/otelcol-contrib.service\n")
    add_process(proc, 901, "python3", "/usr/bin/python3.11", "0::/user.slice/user-65534.slice/session-4.scope\n",
                uid=65534)
    add_process(proc, 902, "otelcol-contrib", "/tmp/otelcol-contrib",
                "0::/user.slice/user-65534.slice/session-4.scope\n", uid=65534)
    return proc


def test_an_unprivileged_sender_claiming_another_process_is_charged_itself(senders_proc):
    """uid 65534 claims root's pid 1 (or a container's process): refused,
    its spans are its own, and each refused request is counted."""
    resolver = PidResolver(senders_proc, trusted_relays=["otelcol"])
    for attributes in ({"process__pid": 1}, {"process__pid": 7, "container__id": DOCKER_ID},
                       {"process__pid": 1, "k8s__pod__uid": POD1}, {"container__id": DOCKER_ID}):
        assert resolver.resolve(resource(**attributes), lambda hint: 901) == (901, "refused_claim"), attributes
    before = metric("jitterscope_otlp_pid_resolved_total", how="refused_claim")
    request = export(with_id("a"), with_id("b", span_id=b"\x01" * 8))
    request.resource_spans[0].resource.CopyFrom(resource(process__pid=1))
    records, _, _ = spans_to_requests(request, resolve_pid=lambda res: resolver.resolve(res, lambda hint: 901))
    assert [r["pid"] for r in records] == [901, 901]
    assert metric("jitterscope_otlp_pid_resolved_total", how="refused_claim") == before + 2


@pytest.mark.parametrize("sender, attributes", [
    (2002, {"process__pid": 1, "container__id": "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"}),
    (2002, {"process__pid": 1, "k8s__pod__uid": POD1}),
    (4001, {"process__pid": 1, "container__id": DOCKER_ID}),
    (4001, {"process__pid": 1, "container__id": DOCKER_ID[:12]}),
    (4001, {"process__pid": 1, "container__id": DOCKER_ID, "k8s__pod__uid": "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e"}),
    (3050, {"process__pid": 7, "container__id": DOCKER_ID}),  # a pod's sender, another pod's container
])
def test_a_sender_in_one_container_cannot_claim_another(sender, attributes):
    """container A claiming container.id of B and process.pid=1 is charged
    to itself: its own cgroup is not skipped for the claim."""
    resolver = PidResolver(CPROC)
    assert resolver.resolve(resource(**attributes), lambda hint: sender) == (sender, "refused_claim")


def test_a_claim_over_loopback_is_charged_to_its_sender(receiver):
    """The receiver for real: this test process is no trusted relay, so its
    claim to be 4242 is refused."""
    before = metric("jitterscope_otlp_pid_resolved_total", how="refused_claim")
    assert post(receiver.port, export(with_id("claimed"), pid=4242).SerializeToString())[0] == 200
    assert [(g["request_id"], g["pid"]) for g in receiver.got] == [("claimed", os.getpid())]
    assert metric("jitterscope_otlp_pid_resolved_total", how="refused_claim") == before + 1


@pytest.mark.parametrize("relays", [["otelcol-contrib"], [RELAY_EXE], ["otelcol", "otelcol-contrib"]])
@pytest.mark.parametrize("attributes, answer", [
    ({"process__pid": 7, "container__id": DOCKER_ID}, (2002, "nspid")),
    ({"process__pid": 1, "k8s__pod__uid": POD1}, (3001, "container")),
    ({"container__id": DOCKER_ID}, (2001, "container")),
    ({"process__pid": 1}, (1, "process_pid")),
    ({"process__pid": 4242}, (4242, "process_pid")),
])
def test_a_named_relay_speaks_for_others(senders_proc, relays, attributes, answer):
    resolver = PidResolver(senders_proc, trusted_relays=relays)
    assert resolver.resolve(resource(**attributes), lambda hint: 900) == answer


def test_a_relay_named_by_path_is_not_whoever_takes_its_name(senders_proc):
    """Any process can call itself otelcol-contrib; only the named file runs as the relay."""
    claim = resource(process__pid=1)
    assert PidResolver(senders_proc, trusted_relays=[RELAY_EXE]).resolve(claim, lambda hint: 902) == (
        902, "refused_claim")
    assert PidResolver(senders_proc, trusted_relays=[]).resolve(claim, lambda hint: 900) == (
        900, "refused_claim")  # the default: no relay


@pytest.mark.parametrize("sender, attributes, answer", [
    (2002, {"process__pid": 1, "container__id": DOCKER_ID}, (2001, "nspid")),
    (2002, {"process__pid": 1, "container__id": "docker://" + DOCKER_ID[:12]}, (2001, "nspid")),
    (2002, {"process__pid": 1}, (2001, "nspid")),  # within its PID namespace's cgroup, as before
    (2001, {"process__pid": 7, "container__id": DOCKER_ID}, (2002, "nspid")),
    (2001, {"container__id": DOCKER_ID}, (2001, "peer")),
    # another container of the sender's own pod
    (3050, {"process__pid": 2, "k8s__pod__uid": POD1,
            "container__id": "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"}, (3001, "container")),
    (3050, {"process__pid": 5, "k8s__pod__uid": POD1}, (3001, "container")),
])
def test_a_sender_speaks_for_its_own_container_and_pod(sender, attributes, answer):
    assert PidResolver(CPROC).resolve(resource(**attributes), lambda hint: sender) == answer


def test_a_receiver_passes_its_trusted_relays_on():
    assert OtlpReceiver("127.0.0.1", 0, list.extend, trusted_relays=["otelcol"]).pids.trusted_relays == ("otelcol",)
