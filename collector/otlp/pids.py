# SPDX-License-Identifier: Apache-2.0
"""Which process sent a span: the process on this host at the other end of
the connection (`pid_of_peer`, from /proc/net/tcp{,6}, /proc/PID/net/tcp{,6}
and /proc/*/fd), and the host pid a resource names, within what its sender
may speak for (`PidResolver`). The rules: the package's docs
(``jitterscope.collector.otlp``), "Who may speak for whom" and "From a
container".
"""

from __future__ import annotations

import ipaddress
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from jitterscope.collector import containers, hostinfo
from jitterscope.collector.otlp.convert import resource_pid, resource_string
from jitterscope.common import ports


def pid_of_peer(peer_host: str, peer_port: int, local_port: int, proc: Path = Path("/proc"),
                hint: int | None = None, local_host: str | None = None) -> int | None:
    """The pid of the process on this host at the other end of a TCP
    connection to our ``local_port`` (and ``local_host``, our end's address,
    where given), or None: another host's, or gone.

    Whatever the address: a socket of this network namespace is in
    /proc/net/tcp{,6}, loopback or not (the node IP a pod or a host process
    sends to is no different); a socket of another namespace on this host (a
    pod's, a container's) is in /proc/PID/net/tcp{,6} of a process in it.
    The socket is the one whose local end is the peer's address and port and
    whose remote end is ours; the process is the one holding
    ``socket:[inode]`` among its fds. Needs the right to read other
    processes' fds and namespaces (root, or CAP_SYS_PTRACE). A scan of
    /proc/*/fd is not free, so callers cache the answer per connection, and
    ``hint`` (the pid the sender claims) is looked at first.
    """
    address, ours = _address(peer_host), _address(local_host) if local_host else None
    if address is None:
        return None
    inode = _socket_inode(ports.tcp_sockets(proc), address, peer_port, local_port, ours)
    if inode is None and not address.is_loopback:  # a loopback peer is always in our own namespace
        for other in _other_namespaces(proc):
            inode = _socket_inode(ports.tcp_sockets(other), address, peer_port, local_port, ours)
            if inode is not None:
                break
    return ports.pid_holding(inode, proc, hint) if inode else None


def _address(text: str):
    try:
        return _unmapped(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None


def _other_namespaces(proc: Path) -> Iterator[Path]:
    """/proc/PID of one process per network namespace other than ours: its
    net/tcp{,6} are that namespace's tables. The sockets of a namespace no
    process is in (a bind-mounted one) are not seen: the peer is not known."""
    try:
        seen = {os.stat(proc / "self" / "ns" / "net").st_ino}
    except OSError:
        seen = set()
    try:
        pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            inode = os.stat(proc / pid / "ns" / "net").st_ino
        except OSError:  # gone, or not ours to look at
            continue
        if inode not in seen:
            seen.add(inode)
            yield proc / pid


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address):
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _socket_inode(table: Iterable[list[str]], address, local_port: int, remote_port: int,
                  remote_address=None) -> int | None:
    for fields in table:
        try:
            local_ip, port = _proc_net_address(fields[1])
            remote_ip, remote_port_here = _proc_net_address(fields[2])
            inode = int(fields[9])
        except ValueError:
            continue
        if (port == local_port and remote_port_here == remote_port and local_ip == address and inode
                and (remote_address is None or remote_ip == remote_address)):
            return inode  # inode 0: a socket no process holds any more (TIME_WAIT)
    return None


def _proc_net_address(text: str):
    """'0100007F:1F90' -> (127.0.0.1, 8080). The address is printed as 32-bit
    words in host byte order; the port is big-endian hex."""
    host_hex, port_hex = text.split(":")
    raw = bytes.fromhex(host_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return _unmapped(ipaddress.ip_address(raw)), int(port_hex, 16)


def _network(entry: str):
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


def relay_networks(entries: Iterable[str]) -> tuple:
    """The address entries of a relay list ("10.0.3.7", "fd00::/64"): the
    others are process names and paths. ValueError for one that covers a
    loopback or unspecified address: every local process can send from it."""
    found = []
    for entry in entries:
        net = _network(entry)
        if net is None:
            continue
        if net.overlaps(ipaddress.ip_network("127.0.0.0/8" if net.version == 4 else "::1/128")) or \
                net.network_address.is_unspecified and net.prefixlen == net.max_prefixlen:
            raise ValueError(f"OTLP relay address {entry!r} covers loopback or no address: every process on "
                             "this host could send as the relay; name an on-host relay by its executable path")
        found.append(net)
    return tuple(found)


class PidResolver:
    """The host pid of a resource's process (see the package's docs); one per
    receiver, shared by its threads.

    Senders are untrusted and an export may carry thousands of resources, so
    /proc is scanned at most once per ``snapshot_s`` (`hostinfo.ns_processes`),
    indexed by container, pod and cgroup; answers are kept ``ttl_s`` (a
    found pid only while it lives; a miss only until the next scan may
    show a container that just started).

    ``trusted_relays``: the senders whose resources may name any process:
    process names (``comm``, compared on the kernel's 15 characters) and
    executable paths (entries starting with "/", compared with
    /proc/PID/exe) of on-host senders, and addresses or networks ("10.0.3.7",
    "10.0.3.0/28") of senders wherever they are (an OpenTelemetry Collector
    on another host, or in a pod). Any process may set its own name, so a
    name trusts whatever calls itself that; a path, only processes running
    that file; an address, whatever can send from it (so never loopback:
    every local process can; refused).

    A sender that is neither on this host (`pid_of_peer` finds no process)
    nor a relay by address has its claims ignored: its spans are kept, at
    host level (pid 0), counted as ``how="unverified_claim"``. Nothing else
    can be known of it, and taking its ``process.pid`` at its word lets
    anyone who reaches the port make any process a watched target."""

    def __init__(self, proc: Path = Path("/proc"), ttl_s: float = 10.0, snapshot_s: float = 1.0,
                 max_entries: int = 4096, trusted_relays: Iterable[str] = ()):
        self.proc = proc
        self.trusted_relays = tuple(r for r in trusted_relays if r)
        self.relay_networks = relay_networks(self.trusted_relays)
        self.ttl_s = ttl_s
        self.snapshot_s = snapshot_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._answers: dict[tuple, tuple[float, int, str]] = {}
        self._scanned_at = -math.inf
        self._by: dict[str, dict[str, list[hostinfo.NsProcess]]] = {}

    def resolve(self, resource: Resource, peer: Callable[[int | None], int | None],
                peer_host: str | None = None) -> tuple[int, str]:
        """(host pid or 0, how); ``peer(hint)`` finds the connection's process
        (None: not on this host, or gone); ``peer_host``: its address."""
        claimed = resource_pid(resource)
        container_id = containers.normal_container_id(resource_string(resource, "container.id"))
        pod_uid = containers.normal_uid(resource_string(resource, "k8s.pod.uid"))
        sender = peer(claimed)
        relay = self._relay_address(peer_host)
        if not sender:
            if relay:  # a relay elsewhere: the resource speaks for itself
                return self._claims(claimed, container_id, pod_uid)
            # not on this host and no relay: a claim is all there is, and worth nothing
            return (0, "unverified_claim") if claimed or container_id or pod_uid else (0, "unresolved")
        if sender == claimed or (claimed is None and not (container_id or pod_uid)):
            return sender, "process_pid" if claimed else "peer"
        ids = hostinfo.ns_pids(sender, self.proc)
        if claimed is not None and ids and ids[-1] == claimed:
            return sender, "peer_nspid"
        if relay or self._trusted_relay(sender):  # an OpenTelemetry Collector: the resource speaks for itself
            if claimed is not None and len(ids) > 1 and not (container_id or pod_uid):
                return self._answer(("cgroup", claimed, self._cgroup(sender)))
            return self._claims(claimed, container_id, pod_uid)
        # Anyone else speaks only for its own container, pod or (in its own
        # PID namespace) cgroup; the lookups below cannot leave them.
        own = self._identity(sender)
        if container_id or pod_uid:
            if pod_uid and pod_uid != own.pod_uid:
                return sender, "refused_claim"
            if container_id and not own.matches(container_id) and not own.pod_uid:
                return sender, "refused_claim"
            if claimed is None:
                return sender, "peer"
            if container_id and not own.matches(container_id):
                # maybe another container of the sender's pod: looked up among the pod's processes only
                pid, how = self._answer(("container", claimed, container_id, own.pod_uid))
                return (pid, how) if pid else (sender, "refused_claim")
            return self._answer(("container", claimed, own.container_id if container_id else "", own.pod_uid))
        if len(ids) > 1:
            # a sender in its own PID namespace speaking for another of its
            # processes: that process shares its cgroup
            return self._answer(("cgroup", claimed, self._cgroup(sender)))
        if own.container_id or own.pod_uid:  # a container sharing the host's PID namespace
            other = self._identity(claimed)
            if (own.container_id and other.container_id == own.container_id) or (
                    own.pod_uid and other.pod_uid == own.pod_uid):
                return claimed, "process_pid"
        return sender, "refused_claim"

    def _claims(self, claimed: int | None, container_id: str, pod_uid: str) -> tuple[int, str]:
        """The host pid the resource names, taken at its word."""
        if container_id or pod_uid:
            return self._answer(("container", claimed, container_id, pod_uid))
        return (claimed, "process_pid") if claimed else (0, "unresolved")

    def _relay_address(self, peer_host: str | None) -> bool:
        address = _address(peer_host) if peer_host and self.relay_networks else None
        return address is not None and any(address in net for net in self.relay_networks)

    def _trusted_relay(self, pid: int) -> bool:
        if not self.trusted_relays:
            return False
        base = self.proc / str(pid)
        try:
            comm = (base / "comm").read_text(errors="replace").rstrip("\n")
        except OSError:
            comm = None
        exe = None
        if any(r.startswith("/") for r in self.trusted_relays):
            try:
                exe = os.readlink(base / "exe")
            except OSError:
                pass
        return any(relay == exe if relay.startswith("/") else relay[:15] == comm
                   for relay in self.trusted_relays if not _network(relay))

    def _identity(self, pid: int) -> containers.ContainerRef:
        try:
            return containers.identity((self.proc / str(pid) / "cgroup").read_text(errors="replace"))
        except OSError:
            return containers.ContainerRef()

    def _cgroup(self, pid: int) -> str | None:
        try:
            return containers.cgroup_path((self.proc / str(pid) / "cgroup").read_text())
        except OSError:
            return None

    def _answer(self, key: tuple) -> tuple[int, str]:
        now = time.monotonic()
        with self._lock:
            hit = self._answers.get(key)
            if hit and hit[0] > now and (not hit[1] or (self.proc / str(hit[1])).exists()):
                return hit[1], hit[2]
            if now - self._scanned_at >= self.snapshot_s:
                self._scan(now)
            pid, how = self._find(key)
            if len(self._answers) >= self.max_entries:
                self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
                if len(self._answers) >= self.max_entries:
                    self._answers.clear()
            self._answers[key] = (now + (self.ttl_s if pid else self.snapshot_s), pid, how)
        return pid, how

    def _scan(self, now: float) -> None:
        self._scanned_at = now
        self._by = {"container": {}, "pod": {}, "cgroup": {}}
        for p in hostinfo.ns_processes(self.proc):
            for index, value in (("container", p.ref.container_id), ("pod", p.ref.pod_uid), ("cgroup", p.cgroup)):
                if value:
                    self._by[index].setdefault(value, []).append(p)

    def _find(self, key: tuple) -> tuple[int, str]:
        if key[0] == "cgroup":
            _, claimed, cgroup = key
            pid = hostinfo.host_pid_for(claimed, peer_cgroup=cgroup, table=self._by["cgroup"].get(cgroup, []))
            return (pid, "nspid") if pid else (0, "unresolved")
        _, claimed, container_id, pod_uid = key
        if container_id:  # Docker prints short IDs: look among the (few) containers
            by_container = self._by["container"]
            table = by_container.get(container_id) or [
                p for cid, ps in by_container.items() if cid.startswith(container_id) for p in ps]
        else:
            table = self._by["pod"].get(pod_uid, [])
        pid, how = hostinfo.pid_in_container(claimed, container_id, pod_uid, table=table)
        return (pid, how) if pid else (0, "unresolved")
