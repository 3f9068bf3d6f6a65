# SPDX-License-Identifier: Apache-2.0
"""collector/containers.py (cgroup path -> container ID / pod UID) and
collector/kubelet.py against a real local HTTP server serving a pod list."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import REGISTRY

from jitterscope.collector.containers import ContainerRef, cgroup_lines, identity, parse_cgroup_path
from jitterscope.collector.kubelet import KubeletPods, PodMeta, parse_pods

CID = "4f2b1c0a9e8d7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e"
UID = "d1f4a9c2-7b3e-4f6a-9c1d-2e3f4a5b6c7d"
UID_ = UID.replace("-", "_")
STATIC_UID = "8e1b0f3c2a4d5e6f7a8b9c0d1e2f3a4b"  # a static pod's UID: its manifest's hash

# Paths as /proc/PID/cgroup shows them on real nodes, per runtime and driver.
LAYOUTS = [
    # containerd, systemd driver (v2 unified line, or a v1 controller line)
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     CID, UID),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
     CID, UID),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", CID, UID),  # Guaranteed QoS
    # CRI-O, systemd driver; its conmon monitor belongs to the pod, not the container
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope", CID, UID),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope",
     "", UID),
    # Docker through cri-dockerd, systemd driver
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope", CID, UID),
    # cgroupfs driver (containerd, CRI-O, Docker), v1 and v2 alike
    (f"/kubepods/burstable/pod{UID}/{CID}", CID, UID),
    (f"/kubepods/besteffort/pod{UID}/{CID}", CID, UID),
    (f"/kubepods/pod{UID}/{CID}", CID, UID),
    (f"/kubepods/burstable/pod{UID}/crio-{CID}", CID, UID),
    (f"/kubepods/burstable/pod{STATIC_UID}/{CID}", CID, STATIC_UID),
    (f"/kubepods/burstable/pod{UID}", "", UID),  # the pod's own cgroup
    # kind / a kubelet with a cgroup root of its own
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", CID, UID),
    # a container's own sub-cgroup (systemd inside it)
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope", CID, UID),
    # read by a collector in a cgroup namespace of its own (v2 default): paths are relative to it
    (f"/../../kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", CID, UID),
    # plain Docker and Podman
    (f"/docker/{CID}", CID, ""),
    (f"/system.slice/docker-{CID}.scope", CID, ""),
    (f"/machine.slice/libpod-{CID}.scope", CID, ""),
    # not containers
    ("/", "", ""),
    ("/user.slice/user-1000.slice/session-3.scope", "", ""),
    ("/system.slice/vllm.service", "", ""),
    ("/system.slice/containerd.service", "", ""),
    ("/kubepods/burstable", "", ""),
    ("/docker/notanid", "", ""),
    (f"/podcast/{UID}", "", ""),  # a "pod" prefix alone is not a pod cgroup
]


@pytest.mark.parametrize("path, container_id, pod_uid", LAYOUTS)
def test_cgroup_path_layouts(path, container_id, pod_uid):
    assert parse_cgroup_path(path) == ContainerRef(container_id, pod_uid)


def test_v1_prefers_the_cpu_controller_line():
    # hybrid v1: the cpu line names the container even where others do not
    text = f"12:memory:/\n4:cpu,cpuacct:/docker/{CID}\n1:name=systemd:/\n0::/init.scope\n"
    assert [c for c, _ in cgroup_lines(text)][:2] == ["cpu,cpuacct", ""]
    assert identity(text) == ContainerRef(CID, "")


def test_v2_single_line():
    text = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
    assert identity(text) == ContainerRef(CID, UID)


def test_no_container_on_a_bare_host():
    assert identity("4:cpu,cpuacct:/\n0::/user.slice\n") == ContainerRef()
    assert identity("") == ContainerRef()


def test_matches_short_and_prefixed_ids():
    ref = ContainerRef(CID, UID)
    assert ref.matches(CID) and ref.matches(CID[:12]) and ref.matches(f"containerd://{CID}")
    assert ref.matches(pod_uid=UID_) and ref.matches(CID, UID)
    assert not ref.matches(CID[:11])  # too short to be sure
    assert not ref.matches("0" * 64) and not ref.matches(CID, "0" * 32)
    assert not ref.matches()  # nothing asked: no match


# -- the kubelet's pod list ---------------------------------------------------

def pod(name, namespace, uid, labels, containers):
    """A PodList item shaped like the kubelet's /pods answer (trimmed)."""
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": labels,
                     "ownerReferences": [{"kind": "ReplicaSet", "name": name.rsplit("-", 1)[0]}]},
        "spec": {"nodeName": "gpu-node-7", "containers": [{"name": c} for c, _ in containers]},
        "status": {"phase": "Running", "qosClass": "Burstable",
                   "containerStatuses": [{"name": c, "containerID": f"containerd://{cid}", "ready": True,
                                          "restartCount": 0, "image": "vllm/vllm-openai:v0.6.3"}
                                         for c, cid in containers]},
    }


POD_LIST = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
    pod("vllm-llama-7d9f8b6c5-x2k4q", "inference", UID, {"app": "vllm", "model": "llama-3-8b"},
        [("vllm", CID), ("metrics-sidecar", "e" * 64)]),
    pod("kube-proxy-abcde", "kube-system", "11111111-2222-4333-8444-555555555555", {}, [("kube-proxy", "f" * 64)]),
    {"metadata": "not an object"},  # shapes a broken kubelet might send are skipped
]}


class _Kubelet(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests.append((self.path, self.headers.get("Authorization")))
        if self.server.fail:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps(POD_LIST).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def kubelet():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Kubelet)
    server.requests, server.fail = [], False
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_parse_pods():
    pods, containers = parse_pods(POD_LIST)
    assert pods[UID].name == "vllm-llama-7d9f8b6c5-x2k4q" and pods[UID].namespace == "inference"
    assert pods[UID].labels == {"app": "vllm", "model": "llama-3-8b"}
    assert containers[CID] == "vllm" and containers["e" * 64] == "metrics-sidecar"
    assert parse_pods({"items": "nope"}) == ({}, {}) and parse_pods([]) == ({}, {})


def test_kubelet_names_pods_and_containers_with_a_bearer_token(kubelet, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    clock = Clock()
    pods = KubeletPods(f"http://127.0.0.1:{kubelet.server_port}", token, clock=clock)
    meta = pods.lookup(UID_, CID)  # the systemd driver's spelling of the UID
    assert meta == PodMeta("vllm-llama-7d9f8b6c5-x2k4q", "inference", "vllm", {"app": "vllm", "model": "llama-3-8b"})
    assert kubelet.requests == [("/pods", "Bearer s3cret-token")]
    # cached: a known pod within the TTL asks nothing more
    clock.now += 30
    assert pods.lookup(UID, "e" * 64).container == "metrics-sidecar"
    assert len(kubelet.requests) == 1
    # an unknown pod refetches, but at most every MIN_REFRESH_S
    assert pods.lookup("99999999-9999-4999-8999-999999999999") == PodMeta()
    assert len(kubelet.requests) == 2
    assert pods.lookup("99999999-9999-4999-8999-999999999998") == PodMeta()
    assert len(kubelet.requests) == 2
    clock.now += 61  # past the TTL
    pods.lookup(UID)
    assert len(kubelet.requests) == 3


def errors_count() -> float:
    return REGISTRY.get_sample_value("jitterscope_kubelet_errors_total") or 0.0


def test_a_failing_kubelet_falls_back_to_the_uid_counted_and_logged_once(kubelet, caplog):
    clock = Clock()
    pods = KubeletPods(f"http://127.0.0.1:{kubelet.server_port}", None, clock=clock)
    assert pods.lookup(UID, CID).pod == "vllm-llama-7d9f8b6c5-x2k4q"
    kubelet.fail = True
    before = errors_count()
    clock.now += 61
    with caplog.at_level("WARNING", logger="jitterscope.collector.kubelet"):
        assert pods.lookup(UID, CID).pod == "vllm-llama-7d9f8b6c5-x2k4q"  # the last good list stays
        clock.now += 61
        assert pods.lookup("99999999-9999-4999-8999-999999999999") == PodMeta()
    assert errors_count() == before + 2
    assert len([r for r in caplog.records if "kubelet" in r.getMessage()]) == 1
    assert kubelet.requests[-1][1] is None  # no token file: no Authorization header


def test_an_unreachable_kubelet_costs_one_timeout_per_ttl():
    import socket
    import time
    listener = socket.socket()  # accepts into the backlog, never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        clock = Clock()
        pods = KubeletPods(f"http://127.0.0.1:{listener.getsockname()[1]}", None, timeout_s=0.3, clock=clock)
        before = errors_count()
        started = time.monotonic()
        assert pods.lookup(UID, CID) == PodMeta()
        first = time.monotonic() - started
        started = time.monotonic()
        assert pods.lookup(UID, CID) == PodMeta()  # within the TTL: not asked again
        assert time.monotonic() - started < 0.1
        assert 0.25 < first < 5 and errors_count() == before + 1
    finally:
        listener.close()


def test_kubelet_from_settings(kubelet):
    from jitterscope.collector import kubelet as kubelet_module
    from jitterscope.common.settings import Settings
    assert kubelet_module.from_settings(Settings(host="h")) is None  # off by default
    pods = kubelet_module.from_settings(
        Settings(host="h", kubelet_url=f"http://127.0.0.1:{kubelet.server_port}/", kubelet_token_file=None))
    assert pods.lookup(UID).namespace == "inference"
