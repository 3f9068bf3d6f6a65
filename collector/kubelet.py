# SPDX-License-Identifier: Apache-2.0
"""Pod names, namespaces, labels and container names from the kubelet.

The cgroup path gives a process's pod UID and container ID
(`collector.containers`); an SRE wants the pod's name and namespace. The
node's own kubelet lists its pods at ``GET /pods`` (the read-only port
10255 over http, or the authenticated port 10250 over https with the
service account's bearer token and RBAC on ``nodes/proxy``).

Optional and never in the way: one fetch at most every ``ttl_s`` (60 s),
each bounded by ``timeout_s`` (2 s); a failure keeps the last good list
(pods do not rename) or answers from the UID alone, is counted in
``jitterscope_kubelet_errors_total`` and logged at most once per
``LOG_EVERY_S``. A redirect is such a failure (common/outbound.py: the
token is never sent on to where it points).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple

from prometheus_client import Counter

from jitterscope.collector.containers import normal_uid
from jitterscope.common import outbound
from jitterscope.common.logs import fields
from jitterscope.common.masking import mask_url

log = logging.getLogger("jitterscope.collector.kubelet")

DEFAULT_TOKEN_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_TTL_S = 60.0
MIN_REFRESH_S = 5.0  # an unknown pod (just started) refetches the list, but not more often than this
LOG_EVERY_S = 300.0
MAX_BODY_BYTES = 64 << 20  # a node's pod list (110 pods by default) is far below this

KUBELET_ERRORS = Counter("jitterscope_kubelet_errors_total",
                         "failed fetches of the kubelet's pod list (pods are then named by UID alone)")


class Pod(NamedTuple):
    name: str
    namespace: str
    labels: dict[str, str]


class PodMeta(NamedTuple):
    pod: str = ""
    namespace: str = ""
    container: str = ""
    labels: dict[str, str] = {}


def parse_pods(document: dict) -> tuple[dict[str, Pod], dict[str, str]]:
    """A PodList as (pod uid -> Pod, container id -> container name).
    Fields of the wrong shape are skipped, never raised on."""
    pods: dict[str, Pod] = {}
    containers: dict[str, str] = {}
    items = document.get("items") if isinstance(document, dict) else None
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        meta = _object(item.get("metadata"))
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            continue
        labels = _object(meta.get("labels"))
        pods[normal_uid(uid)] = Pod(str(meta.get("name", "")), str(meta.get("namespace", "")),
                                    {str(k): str(v) for k, v in labels.items()})
        status = _object(item.get("status"))
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            statuses = status.get(key)
            for c in statuses if isinstance(statuses, list) else []:
                if isinstance(c, dict) and isinstance(c.get("containerID"), str):
                    # "containerd://<id>", "cri-o://<id>", "docker://<id>"
                    containers[c["containerID"].rsplit("/", 1)[-1].lower()] = str(c.get("name", ""))
    return pods, containers


def _object(value: object) -> dict:
    return value if isinstance(value, dict) else {}


class KubeletPods:
    """The kubelet's pod list, cached; `lookup` is thread-safe."""

    def __init__(self, url: str, token_file: Path | str | None = DEFAULT_TOKEN_FILE,
                 timeout_s: float = DEFAULT_TIMEOUT_S, ttl_s: float = DEFAULT_TTL_S,
                 insecure_tls: bool = False, clock: Callable[[], float] = time.monotonic):
        self.url = url.rstrip("/") + "/pods"
        self.token_file = Path(token_file) if token_file else None
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.clock = clock
        self._tls = ssl.create_default_context()
        if insecure_tls:  # kubelets often serve a self-signed certificate
            self._tls.check_hostname = False
            self._tls.verify_mode = ssl.CERT_NONE
        # The request carries the service account's token: a 3xx is a failed
        # fetch (counted), never followed to where it points, and no proxy is
        # used: the kubelet is this node's own (http_proxy is for egress).
        self._opener = outbound.opener(proxies=False, tls=self._tls)
        self._lock = threading.Lock()
        self._pods: dict[str, Pod] = {}
        self._containers: dict[str, str] = {}
        self._fetched_at: float | None = None  # last attempt, good or not
        self._logged_at: float | None = None

    def lookup(self, pod_uid: str, container_id: str = "") -> PodMeta:
        """Name, namespace and labels of the pod, and the container's name;
        empty fields where the kubelet does not know (or cannot be asked)."""
        if not pod_uid and not container_id:
            return PodMeta()
        uid = normal_uid(pod_uid)
        with self._lock:
            now = self.clock()
            age = None if self._fetched_at is None else now - self._fetched_at
            if age is None or age >= self.ttl_s or (uid and uid not in self._pods and age >= MIN_REFRESH_S):
                self._refresh(now)
            pod = self._pods.get(uid)
            container = self._containers.get(container_id.lower(), "") if container_id else ""
        if pod is None:
            return PodMeta(container=container)
        return PodMeta(pod.name, pod.namespace, container, pod.labels)

    def _refresh(self, now: float) -> None:
        self._fetched_at = now
        headers = {"Accept": "application/json"}
        try:
            if self.token_file is not None and self.token_file.is_file():
                # read each time: projected service account tokens rotate
                headers["Authorization"] = "Bearer " + self.token_file.read_text().strip()
            request = urllib.request.Request(self.url, headers=headers)
            with self._opener.open(request, timeout=self.timeout_s) as answer:
                body = answer.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise ValueError(f"pod list over {MAX_BODY_BYTES} bytes")
            self._pods, self._containers = parse_pods(json.loads(body))
        except (OSError, ValueError) as exc:  # URLError, HTTPError and timeouts are OSErrors
            KUBELET_ERRORS.inc()
            if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning("kubelet pod list unavailable: pods are named by UID only "
                            "(check kubelet_url, the token in kubelet_token_file and RBAC on nodes/proxy)",
                            extra=fields(url=mask_url(self.url), error=str(exc)[:200]))


def from_settings(settings) -> KubeletPods | None:
    """The collector's kubelet client, or None when ``kubelet_url`` is unset."""
    if not settings.kubelet_url:
        return None
    return KubeletPods(settings.kubelet_url, settings.kubelet_token_file,
                       insecure_tls=settings.kubelet_insecure_tls)
