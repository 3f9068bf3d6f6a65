# SPDX-License-Identifier: Apache-2.0
"""Senders in containers, for real: a stand-in exporting spans with the
OpenTelemetry SDK from its own PID namespace (``unshare --pid --fork
--mount-proc``, reporting its namespaced pid as ``process.pid``), from its
own network namespace (``ip netns`` + a veth pair: its socket is in that
namespace's tables, not this one's), placed in a cgroup v1 named like a Docker or Kubernetes
container; and a collector reading the host's /proc and /sys under another
root (``host_root``). The request records must carry the HOST pid.

No container runtime runs on the build machines (no Docker engine; podman
refuses their hybrid cgroups); these are the kernel
namespaces and cgroup layouts a runtime would make. Needs root and the v1
cpu controller at /sys/fs/cgroup/cpu (this machine, CI)."""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import textwrap
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from jitterscope.collector.otlp import OtlpReceiver
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
REQUESTS = 5

# The stand-in: pid 1 of its namespace forks the sender, so the sender's
# namespaced pid (2) is neither 1 nor its host pid. It prints that pid once
# its spans are flushed, then stays alive until stdin closes (a translation
# needs the process to exist).
SENDER = textwrap.dedent("""
    import json, os, sys, time
    if os.fork():
        _, status = os.wait()
        sys.exit(os.waitstatus_to_exitcode(status))
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind
    endpoint, extra, prefix = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    provider = TracerProvider(resource=Resource(
        {"service.name": "containerised-standin", "process.pid": os.getpid(), **extra}))
    session = requests.Session()
    session.trust_env = False  # no proxies: the connection must be this process's own
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=endpoint, session=session), schedule_delay_millis=100))
    tracer = provider.get_tracer("standin")
    for i in range(%d):
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER,
                                          attributes={"gen_ai.request.id": prefix + str(i)}):
            time.sleep(0.002)
    provider.force_flush()
    print(os.getpid(), flush=True)
    sys.stdin.read()
""" % REQUESTS)


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def metric(how: str) -> float:
    return REGISTRY.get_sample_value("jitterscope_otlp_pid_resolved_total", {"how": how}) or 0.0


@contextmanager
def cgroup(*parts: str):
    """A v1 cpu cgroup /sys/fs/cgroup/cpu/jitterscope-test-<rand>/<parts...>,
    removed (deepest first) afterwards."""
    top = CPU_CGROUP / f"jitterscope-test-{secrets.token_hex(4)}"
    path = top.joinpath(*parts)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        for directory in [path, *path.parents]:
            if directory == CPU_CGROUP:
                break
            try:
                directory.rmdir()
            except OSError:
                pass


@contextmanager
def netns_with_veth():
    """A network namespace joined to this one by a veth pair: (namespace,
    our address, its address). Names and addresses unique per run (other
    tests may make namespaces at the same time)."""
    tag = secrets.token_hex(3)
    ns, here, there = f"jsc-{tag}", f"jsc{tag}a", f"jsc{tag}b"
    net = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
    subnet = random.randrange(0, 256, 4)
    ours, theirs = f"{net}.{subnet + 1}", f"{net}.{subnet + 2}"
    run("ip", "netns", "add", ns)
    try:
        run("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        run("ip", "link", "set", there, "netns", ns)
        run("ip", "addr", "add", f"{ours}/30", "dev", here)
        run("ip", "link", "set", here, "up")
        run("ip", "-n", ns, "addr", "add", f"{theirs}/30", "dev", there)
        run("ip", "-n", ns, "link", "set", there, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        yield ns, ours, theirs
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)  # takes its peer along
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def in_pid_namespace(command: list[str], cgroup_dir: Path | None = None, netns: str | None = None,
                     **popen) -> subprocess.Popen:
    """``command`` as pid 1 of a new PID namespace (with its own /proc), in
    ``cgroup_dir`` (joined before anything starts, so all of it is inside)
    and network namespace ``netns``. Killing the Popen kills the namespace."""
    inner = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command]
    if netns:
        inner = ["ip", "netns", "exec", netns, *inner]
    join = f'echo $$ > "{cgroup_dir}/cgroup.procs" && ' if cgroup_dir else ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.Popen(["sh", "-c", f'{join}exec "$@"', "sh", *inner], env=env, **popen)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def host_pid_of_sender(popen: subprocess.Popen) -> int:
    """unshare (the Popen, after the execs) -> pid 1 -> the sender: found by
    the process tree, independently of NSpid."""
    (init,) = children(popen.pid)
    (sender,) = children(init)
    return sender


@contextmanager
def started(popen: subprocess.Popen):
    try:
        yield popen
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(30)


def send_and_check(receiver: OtlpReceiver, got: list, endpoint_host: str, extra: dict, tmp_path: Path,
                   cgroup_dir: Path | None = None, netns: str | None = None) -> tuple[int, int]:
    """Runs the stand-in; returns (its namespaced pid, its host pid) after
    checking every request record carries the host pid."""
    script = tmp_path / "sender.py"
    script.write_text(SENDER)
    prefix = f"c-{secrets.token_hex(4)}-"
    endpoint = f"http://{endpoint_host}:{receiver.port}/v1/traces"
    with started(in_pid_namespace([sys.executable, str(script), endpoint, json.dumps(extra), prefix],
                                  cgroup_dir, netns, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)) as sender:
        ns_pid = int(sender.stdout.readline() or 0)
        assert ns_pid, sender.stderr.read()
        host_pid = host_pid_of_sender(sender)
        mine = lambda: [r for r in got if r["request_id"].startswith(prefix)]  # noqa: E731
        wait_until(lambda: len(mine()) == REQUESTS, 60, "the stand-in's request records")
        sender.stdin.close()
        assert sender.wait(30) == 0, sender.stderr.read()
    assert ns_pid == 2 and host_pid != ns_pid
    assert {r["pid"] for r in mine()} == {host_pid}
    return ns_pid, host_pid


@pytest.fixture
def decoy():
    """Another PID namespace whose pid 2 is not the stand-in: a translation
    that ignored the container would be ambiguous (so answer nothing)."""
    with started(in_pid_namespace(["sh", "-c", "sleep 300 & wait"])) as popen:
        wait_until(lambda: children(popen.pid) and children(children(popen.pid)[0]), 30, "the decoy's pid 2")
        yield popen


def collect(host: str):
    got: list[dict] = []
    return got, OtlpReceiver(host, 0, got.extend)


def test_pid_namespace_on_loopback_is_the_connections_process(decoy, tmp_path):
    """No container attributes: the loopback owner is found, and its
    innermost pid is the process.pid it sent."""
    got, receiver = collect("127.0.0.1")
    before = metric("peer_nspid")
    with receiver:
        send_and_check(receiver, got, "127.0.0.1", {}, tmp_path)
    assert metric("peer_nspid") == before + REQUESTS


@pytest.mark.parametrize("layout", ["docker", "kubepods"])
def test_other_network_and_pid_namespace_is_the_connections_process(layout, decoy, tmp_path):
    """Its socket is found in its network namespace's tables: the sender,
    whose innermost pid is the process.pid it sent (the container
    attributes' translation: tests/unit/collector/otlp/test_otlp_pids.py)."""
    container_id = secrets.token_hex(32)
    if layout == "docker":  # plain Docker, cgroupfs driver: /docker/<id>
        parts, extra = ("docker", container_id), {"container.id": container_id}
    else:  # kubelet cgroupfs driver; the SDK's k8s detector sets the pod UID
        pod_uid = str(uuid.uuid4())
        parts, extra = ("kubepods", "besteffort", f"pod{pod_uid}", container_id), {"k8s.pod.uid": pod_uid}
    before = metric("peer_nspid"), metric("unresolved")
    with ExitStack() as stack:
        cgroup_dir = stack.enter_context(cgroup(*parts))
        ns, ours, _ = stack.enter_context(netns_with_veth())
        got, receiver = collect(ours)
        stack.enter_context(receiver)
        send_and_check(receiver, got, ours, extra, tmp_path, cgroup_dir, ns)
    assert (metric("peer_nspid"), metric("unresolved")) == (before[0] + REQUESTS, before[1])


def test_other_network_namespace_claiming_an_unknown_container_is_charged_itself(tmp_path):
    """A container.id that matches no process, not the sender's own: its
    socket is found in its network namespace, and the spans are its own (its
    host pid: its innermost pid is the process.pid it sent), never the
    namespaced pid taken for a host pid."""
    before = metric("peer_nspid")
    with ExitStack() as stack:
        cgroup_dir = stack.enter_context(cgroup("docker", secrets.token_hex(32)))
        ns, ours, _ = stack.enter_context(netns_with_veth())
        got, receiver = collect(ours)
        stack.enter_context(receiver)
        script = tmp_path / "sender.py"
        script.write_text(SENDER)
        endpoint = f"http://{ours}:{receiver.port}/v1/traces"
        with started(in_pid_namespace([sys.executable, str(script), endpoint,
                                       json.dumps({"container.id": "f" * 64}), "u-"], cgroup_dir, ns,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)) as sender:
            wait_until(lambda: len(got) == REQUESTS, 60, "the stand-in's request records")
            host_pid = host_pid_of_sender(sender)
            sender.stdin.close()
            sender.wait(30)
    assert {r["pid"] for r in got} == {host_pid}
    assert metric("peer_nspid") == before + REQUESTS


# The collector with the host's /proc and /sys under another root, in a
# private mount namespace (its mounts vanish with it, and unmounting a
# recursive bind of /sys cannot propagate back to the real one).
ROOTED = textwrap.dedent("""
    import json, os, socket, sys
    from pathlib import Path
    from types import SimpleNamespace
    from jitterscope.collector import hostinfo, topology
    from jitterscope.collector.agent import Collector
    from jitterscope.collector.otlp import pid_of_peer
    from jitterscope.common.settings import Settings
    root = Path(sys.argv[1])
    collector = Collector(Settings(host="t", host_root=root, spool_max_mb=0), publisher=SimpleNamespace())
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, (peer_host, peer_port) = server.accept()
    out = {"proc": str(collector.proc), "sys": str(collector.sys)}
    for name, proc, sys_ in (("rooted", collector.proc, collector.sys), ("direct", Path("/proc"), Path("/sys"))):
        out[name] = {
            "processes": [hostinfo.process_info(pid, proc) for pid in (1, os.getpid(), os.getppid())],
            "topology": topology.read_topology(sys_, proc, nvml=False),
            "boot_id": hostinfo.boot_id(proc),
            "peer": pid_of_peer(peer_host, peer_port, server.getsockname()[1], proc),
        }
    import msgspec
    print(json.dumps(msgspec.to_builtins(out)))
""")


def test_host_root_reads_the_same_host(tmp_path):
    root = tmp_path / "host"
    (root / "proc").mkdir(parents=True)
    (root / "sys").mkdir()
    script = tmp_path / "rooted.py"
    script.write_text(ROOTED)
    mount = f'mount --rbind /proc "{root}/proc" && mount --rbind /sys "{root}/sys" && exec "$@"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
         sys.executable, str(script), str(root)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["proc"], out["sys"]) == (str(root / "proc"), str(root / "sys"))
    assert out["rooted"] == out["direct"]
    assert out["rooted"]["processes"][1]["comm"] == "python3" or out["rooted"]["processes"][1]["cmdline"]
    assert out["rooted"]["peer"] > 0 and out["rooted"]["topology"]["cpus"]
    # nothing is left mounted here
    assert not any(str(root) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())
