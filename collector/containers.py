# SPDX-License-Identifier: Apache-2.0
"""Container and Kubernetes identity from a cgroup path (pure functions).

Container runtimes name a container's cgroup after its 64-hex ID, and the
kubelet names a pod's cgroup after its UID; both survive in
``/proc/PID/cgroup`` whatever the runtime's cgroup driver:

==========================  ==================================================================
systemd driver (v1, v2)     ``/kubepods.slice/kubepods-burstable.slice/``
                            ``kubepods-burstable-pod<uid, - as _>.slice/cri-containerd-<id>.scope``
                            (CRI-O: ``crio-<id>.scope``; cri-dockerd: ``docker-<id>.scope``)
cgroupfs driver (v1, v2)    ``/kubepods/burstable/pod<uid>/<id>`` (guaranteed pods: no QoS level)
plain Docker                ``/docker/<id>`` (cgroupfs), ``/system.slice/docker-<id>.scope`` (systemd)
Podman                      ``/machine.slice/libpod-<id>.scope``
==========================  ==================================================================

A kubelet can be given a cgroup root (kind: ``/kubelet.slice/kubelet-kubepods.slice/...``),
and a container may make sub-cgroups of its own, so each path component is
matched on its own and the innermost match wins.

CRI-O's ``crio-conmon-<id>.scope`` is the runtime's monitor for the
container, not the container: it belongs to the pod, with no container ID.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# A container cgroup: the bare ID (cgroupfs driver) or the runtime's systemd scope.
_CONTAINER = re.compile(r"(?:(?:cri-containerd|crio|docker|libpod|containerd)-)?([0-9a-f]{64})(?:\.scope)?")
# A pod cgroup: pod<uid> (cgroupfs) or kubepods[-<qos>]-pod<uid with _ for ->.slice (systemd).
# Static pods' UIDs are 32 hex digits without dashes (a hash of the manifest).
_POD = re.compile(r"(?:[a-z]+-)*pod([0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12})"
                  r"(?:\.slice)?")


class ContainerRef(NamedTuple):
    container_id: str = ""  # 64 hex digits, "" when not in a container
    pod_uid: str = ""  # with dashes, as the API server writes it; "" when not in a pod

    def matches(self, container_id: str | None = None, pod_uid: str | None = None) -> bool:
        """Whether this is the container and/or pod asked for. A container ID
        may be given short (Docker prints 12 digits), never shorter."""
        if container_id:
            wanted = normal_container_id(container_id)
            if len(wanted) < 12 or not self.container_id.startswith(wanted):
                return False
        if pod_uid and normal_uid(pod_uid) != self.pod_uid:
            return False
        return bool(container_id or pod_uid)


def normal_container_id(container_id: str) -> str:
    """A container ID as its cgroup names it: the kubelet writes "containerd://<id>"."""
    return container_id.strip().lower().rsplit("://", 1)[-1]


def normal_uid(uid: str) -> str:
    """A pod UID as the API server writes it (the systemd driver swaps - for _)."""
    return uid.strip().lower().replace("_", "-")


def parse_cgroup_path(path: str) -> ContainerRef:
    """The container ID and pod UID a cgroup path names ("" where it names none)."""
    container_id = pod_uid = ""
    for part in path.split("/"):
        if part.startswith("crio-conmon-"):
            continue  # the runtime's monitor, not the container
        found = _CONTAINER.fullmatch(part)
        if found:
            container_id = found.group(1)
            continue
        found = _POD.fullmatch(part)
        if found and part.startswith(("pod", "kubepods", "kubelet")):
            pod_uid = normal_uid(found.group(1))
    return ContainerRef(container_id, pod_uid)


def cgroup_lines(text: str) -> list[tuple[str, str]]:
    """``/proc/PID/cgroup`` as (controllers, path), the best line for identity
    first: on cgroup v1 the cpu controller's (where CPU limits live, so the
    one every runtime sets up), then the v2 line, then the rest as listed."""
    lines = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            lines.append((parts[1], parts[2]))

    def rank(item: tuple[str, str]) -> int:
        controllers = item[0].split(",")
        return 0 if "cpu" in controllers else 1 if item[0] == "" else 2

    return sorted(lines, key=rank)


def cgroup_path(cgroup_text: str) -> str | None:
    """The path of a process's best line (see `cgroup_lines`): the cgroup
    that tells processes of one container from another's."""
    lines = cgroup_lines(cgroup_text)
    return lines[0][1] if lines else None


def identity(cgroup_text: str) -> ContainerRef:
    """The container/pod of a process from its ``/proc/PID/cgroup`` text: the
    first line (in `cgroup_lines` order) that names one."""
    for _, path in cgroup_lines(cgroup_text):
        ref = parse_cgroup_path(path)
        if ref.container_id or ref.pod_uid:
            return ref
    return ContainerRef()
