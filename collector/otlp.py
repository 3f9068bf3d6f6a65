# SPDX-License-Identifier: Apache-2.0
"""The collector's OpenTelemetry receiver: OTLP/HTTP traces in, requests out.

Inference servers (vLLM first) export a span per request. Each request span
becomes the fields of a ``jitterscope.schemas.events.RequestSpan`` (everything
but the ``Record`` stamps host/boot_id/seq/ts_ns, which the caller adds; its
``ts_ns`` is the span's end)::

    RequestSpan(**stamp.header(RequestSpan, fields["end_ns"]), **fields)

Which spans are requests: one carrying a request-ID attribute
(``gen_ai.request.id`` by default), else a root or SERVER span, identified
by its trace ID. Other spans (a request's children) are skipped and counted.

The serving process: the process at the other end of the HTTP connection,
looked up in /proc for loopback peers (`pid_of_peer`), else the resource
attribute ``process.pid``, else 0 (host level).

Who may speak for whom: a sender on this host (its connection's process is
known) is charged its own spans. Its resource may name another process
(``process.pid``, ``container.id``, ``k8s.pod.uid``) only within the
sender's own container or pod, or, for a sender in its own PID namespace,
its own cgroup; a claim beyond that is refused: the spans are charged to the
sender and counted as ``how="refused_claim"``. Only a relay named in
``trusted_relays`` (setting ``otlp_trusted_relays``: process names as
/proc/PID/comm shows them, or executable paths as /proc/PID/exe does; an
OpenTelemetry Collector) speaks for any process. A sender whose process is
not known (not on loopback: another host, or another network namespace)
is taken at its resource's word, the only evidence there is; its
``process.pid`` is trusted only because the collector listens for this host.

From a container, ``process.pid`` is a pid in the container's PID namespace
(`PidResolver`): where the connection's process is known and its innermost
pid (NSpid) is ``process.pid``, it is the sender; else a resource with
``container.id`` or ``k8s.pod.uid`` is translated through NSpid among that
container's processes (the sender's own container or pod where the sender
is known; a sender in its own network namespace has no loopback owner to
look up); a sender known to be in another PID namespace without those
attributes is translated within its own cgroup. A translation
that finds nothing gives pid 0, never the untranslated pid (which names
some unrelated host process). How each request's pid was found is counted
in ``jitterscope_otlp_pid_resolved_total{how}``.

Bodies are untrusted: sizes are capped before reading and after gunzip, parse
errors answer 400, attribute strings are kept verbatim as data (truncated),
and nothing a sender does makes a handler raise. Frequent events are
counters (``jitterscope_otlp_*``), not log lines.

Spans whose ids or times are impossible are *rejected* one by one, never the
whole export: the others are kept, and the answer is an OTLP partial success
(``rejected_spans`` and a message). Times must fit the store's DateTime64(9)
(epoch ns below 2^63, see ``schemas.events.EpochNs``): a value at or past that
would fail a whole ClickHouse insert later. Beyond that, a span that starts
at 0, ends before it starts, or ends more than ``MAX_FUTURE_NS`` (a day)
after the receiver's clock is a broken clock, not a request. There is no floor
on how old a span may be: spans and kernel events share the host's clock, so
an old-looking clock still joins.

Senders are untrusted too: at most ``max_connections`` connections are served
at once (more wait in the kernel's accept backlog, served as slots free up),
and each request, headers and body, must arrive within ``read_timeout_s``
from when the receiver starts reading it. A client that sent part of a
request by then gets 408 and is disconnected; one that sent nothing (an idle
keep-alive connection) is disconnected quietly. So a slowloris holds a slot
for ``read_timeout_s`` at most.
"""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterable, NamedTuple
from urllib.parse import urlsplit

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client import Counter

from jitterscope.collector import containers, hostinfo
from jitterscope.common import ports
from jitterscope.common.errors import JitterscopeError
from jitterscope.schemas.events import MAX_EPOCH_NS

log = logging.getLogger("jitterscope.collector.otlp")

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
DEFAULT_REQUEST_ID_ATTRIBUTES: tuple[str, ...] = ("gen_ai.request.id",)
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_READ_TIMEOUT_S = 10.0
MAX_STRING_CHARS = 256  # request IDs and span names longer than this are truncated
MAX_PHASE_S = 86_400.0  # a phase longer than a day is a broken clock, not a slow request
PID_MAX_LIMIT = 1 << 22  # the kernel's ceiling for pid_max (so any pid fits RequestSpan.pid, a U32)
# A span ending later than this after our clock is a broken sender clock; a
# day leaves room for skew between hosts when spans are relayed.
MAX_FUTURE_NS = 86_400 * 10**9

# vLLM's per-request latency attributes (seconds, as doubles) -> RequestSpan fields.
PHASE_ATTRIBUTES = {
    "queue_ns": "gen_ai.latency.time_in_queue",
    "prefill_ns": "gen_ai.latency.time_in_model_prefill",
    "decode_ns": "gen_ai.latency.time_in_model_decode",
    "ttft_ns": "gen_ai.latency.time_to_first_token",
}

_STATUS = {Status.STATUS_CODE_OK: "ok", Status.STATUS_CODE_ERROR: "error"}

HTTP_REQUESTS = Counter("jitterscope_otlp_http_requests_total", "OTLP HTTP requests answered, by status", ["code"])
SPANS_RECEIVED = Counter("jitterscope_otlp_spans_received_total", "spans in accepted OTLP export requests")
SPANS_SKIPPED = Counter("jitterscope_otlp_spans_skipped_total",
                        "valid spans that are not requests (a request's child spans)")
SPANS_REJECTED = Counter("jitterscope_otlp_spans_rejected_total",
                         "invalid spans refused (answered as an OTLP partial success), by reason", ["reason"])
REQUESTS_PRODUCED = Counter("jitterscope_otlp_request_records_total", "request records produced from spans")
CONNECTION_ERRORS = Counter("jitterscope_otlp_connection_errors_total",
                            "connections that failed before a request could be answered")
TIMEOUTS = Counter("jitterscope_otlp_timeouts_total",
                   "connections closed because a request did not arrive in time, by whether "
                   "part of it had (answered 408) or none (idle, closed quietly)", ["partial"])
PID_RESOLVED = Counter(
    "jitterscope_otlp_pid_resolved_total",
    "request records by how their host pid was found: process_pid (the resource's, as sent), peer (the "
    "connection's process), peer_nspid (the connection's process, whose pid in its container is process.pid), "
    "nspid (process.pid translated through NSpid in the container, pod or sender's cgroup), container (a "
    "process of the container/pod of container.id/k8s.pod.uid: the exact one was not found), unresolved "
    "(nothing matched: host level, pid 0), refused_claim (an on-host sender that is no trusted relay named a "
    "process outside its own container, pod or cgroup: charged to the sender)", ["how"])


class OtlpError(Exception):
    """A request the receiver refuses: ``status_code`` is the HTTP answer."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class OtlpReceiverUnavailable(JitterscopeError):
    """The receiver cannot listen on its address."""


# -- parsing ---------------------------------------------------------------

def media_type(content_type: str | None) -> str:
    """PROTOBUF or JSON from a Content-Type header (parameters ignored); 415 otherwise."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise OtlpError(415, f"unsupported content type {kind!r}: send {PROTOBUF} or {JSON}")
    return kind


def parse_export_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An OTLP/HTTP trace export body, protobuf or JSON; OtlpError on anything else."""
    kind = media_type(content_type)
    request = ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError, ValueError) as exc:
            raise OtlpError(400, f"malformed protobuf: {exc}") from None
        return request
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise OtlpError(400, f"malformed JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpError(400, "OTLP JSON must be an object")
    _hex_ids_to_base64(document)
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise OtlpError(400, f"invalid OTLP JSON: {exc}") from None
    return request


def _hex_ids_to_base64(document: object) -> None:
    """OTLP JSON writes trace and span IDs as hex, where protobuf's JSON mapping
    (json_format) expects base64 for bytes fields: rewrite them in place.
    Anything shaped unexpectedly is left for ParseDict to reject."""

    def items(parent: object, key: str) -> Iterable[dict]:
        value = parent.get(key) if isinstance(parent, dict) else None
        return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []

    def convert(obj: dict, keys: tuple[str, ...]) -> None:
        for key in keys:
            for name in (key, _snake(key)):  # ParseDict also accepts the proto field names
                value = obj.get(name)
                if isinstance(value, str):
                    try:
                        obj[name] = base64.b64encode(bytes.fromhex(value)).decode()
                    except ValueError:
                        raise OtlpError(400, f"{name} {value[:64]!r} is not hex") from None

    for resource_spans in items(document, "resourceSpans") + items(document, "resource_spans"):
        for scope_spans in items(resource_spans, "scopeSpans") + items(resource_spans, "scope_spans"):
            for span in items(scope_spans, "spans"):
                convert(span, ("traceId", "spanId", "parentSpanId"))
                for link in items(span, "links"):
                    convert(link, ("traceId", "spanId"))


def _snake(camel: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in camel)


# -- spans to requests -----------------------------------------------------

class Converted(NamedTuple):
    records: list[dict]  # RequestSpan fields, less the Record stamps
    skipped: int  # valid spans that are not requests (children)
    rejected: dict[str, int]  # invalid spans, by reason (see `_Rejected`)

    def rejection_message(self) -> str:
        """The partial-success error message: counts by reason."""
        reasons = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(self.rejected.items()))
        return f"{sum(self.rejected.values())} spans rejected: {reasons}" if self.rejected else ""


class _Rejected(Exception):
    """An invalid span; ``reason`` is a short fixed word (a metric label)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def spans_to_requests(request: ExportTraceServiceRequest,
                      request_id_attributes: Iterable[str] = DEFAULT_REQUEST_ID_ATTRIBUTES,
                      peer_pid: int | None = None, now_ns: int | None = None,
                      resolve_pid: Callable[[Resource], tuple[int, str]] | None = None) -> Converted:
    """The RequestSpan fields (less the Record stamps) of every request span in
    ``request``, how many valid spans were not requests, and how many invalid
    ones were rejected, by reason. ``peer_pid`` is the sending process, used
    where a resource has no ``process.pid``; ``now_ns`` the clock for the
    future bound (default: now). ``resolve_pid`` (the receiver's
    `PidResolver`), where given, finds each resource's host pid instead,
    and its records are counted in PID_RESOLVED by how."""
    request_id_attributes = tuple(request_id_attributes)
    latest_end_ns = min((time.time_ns() if now_ns is None else now_ns) + MAX_FUTURE_NS, MAX_EPOCH_NS)
    records: list[dict] = []
    skipped = 0
    rejected: dict[str, int] = {}
    for resource_spans in request.resource_spans:
        if resolve_pid is None:
            pid, how = resource_pid(resource_spans.resource) or peer_pid or 0, None
        else:
            pid, how = resolve_pid(resource_spans.resource)
        if not 0 <= pid <= PID_MAX_LIMIT:
            pid = 0  # a pid that cannot be one (the column is a U32): host level
        produced = len(records)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                try:
                    record = _span_to_request(span, pid, request_id_attributes, latest_end_ns)
                except _Rejected as exc:
                    rejected[exc.reason] = rejected.get(exc.reason, 0) + 1
                    continue
                if record is None:
                    skipped += 1
                else:
                    records.append(record)
        if how is not None and len(records) > produced:
            PID_RESOLVED.labels(how=how).inc(len(records) - produced)
    return Converted(records, skipped, rejected)


def resource_pid(resource: Resource) -> int | None:
    """The resource's ``process.pid``, where it is a plausible pid."""
    for kv in resource.attributes:
        if kv.key == "process.pid":
            value = _number(kv.value)
            if isinstance(value, int) and 0 < value <= PID_MAX_LIMIT:
                return value
            return None
    return None


def resource_string(resource: Resource, key: str) -> str:
    """A string resource attribute (``container.id``, ``k8s.pod.uid``), "" if absent."""
    for kv in resource.attributes:
        if kv.key == key:
            return kv.value.string_value[:MAX_STRING_CHARS] if kv.value.WhichOneof("value") == "string_value" else ""
    return ""


def _span_to_request(span: Span, pid: int, request_id_attributes: tuple[str, ...],
                     latest_end_ns: int) -> dict | None:
    """A request's fields; None for a valid span that is not a request;
    `_Rejected` for an invalid one."""
    # Ids of the wrong length (or all zero) are invalid in OTLP; a record
    # keyed by them would join nothing.
    if len(span.trace_id) != 16 or len(span.span_id) != 8 or not any(span.trace_id):
        raise _Rejected("bad_ids")
    start, end = span.start_time_unix_nano, span.end_time_unix_nano  # fixed64: 0 .. 2^64-1
    if start == 0:
        raise _Rejected("no_start_time")
    if end < start:
        raise _Rejected("end_before_start")
    if end > MAX_EPOCH_NS:  # past 2262: does not fit DateTime64(9), would poison the store
        raise _Rejected("time_out_of_range")
    if end > latest_end_ns:
        raise _Rejected("time_in_future")
    attributes: dict[str, AnyValue] = {}
    for kv in span.attributes:
        attributes.setdefault(kv.key, kv.value)  # duplicate keys are invalid; the first wins
    trace_id = span.trace_id.hex()
    request_id = next((s for s in map(_id_string, map(attributes.get, request_id_attributes)) if s), None)
    if request_id is None:
        is_root = not any(span.parent_span_id)
        if not (is_root or span.kind == Span.SPAN_KIND_SERVER):
            return None  # a request's child span
        request_id = trace_id
    record = {
        "request_id": request_id[:MAX_STRING_CHARS],
        "trace_id": trace_id,
        "span_id": span.span_id.hex(),
        "name": span.name[:MAX_STRING_CHARS],
        "pid": pid,
        "start_ns": span.start_time_unix_nano,
        "end_ns": span.end_time_unix_nano,
        "status": _STATUS.get(span.status.code, "unset"),
    }
    for field, key in PHASE_ATTRIBUTES.items():
        record[field] = _seconds_to_ns(_number(attributes[key])) if key in attributes else 0
    thread = attributes.get("thread.id")
    if thread is not None and thread.WhichOneof("value") == "int_value" and 0 < thread.int_value < 2**31:
        record["tid"] = thread.int_value
    return record


def _id_string(value: AnyValue | None) -> str | None:
    """A request ID may arrive as a string or an integer; anything else is not one."""
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    return None


def _number(value: AnyValue) -> int | float | None:
    kind = value.WhichOneof("value")
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    return None


def _seconds_to_ns(seconds: int | float | None) -> int:
    if seconds is None or not math.isfinite(seconds) or not 0 <= seconds <= MAX_PHASE_S:
        return 0
    return round(seconds * 1e9)


# -- which process sent it -------------------------------------------------

def pid_of_peer(peer_host: str, peer_port: int, local_port: int, proc: Path = Path("/proc"),
                hint: int | None = None) -> int | None:
    """The pid of the local process at the other end of a loopback TCP
    connection to our ``local_port``, or None.

    Its socket is the one in /proc/net/tcp{,6} whose local end is the peer's
    port and whose remote end is our port; the process is the one holding
    ``socket:[inode]`` among its fds. Needs the right to read other processes'
    fds (root, or the same user). A scan of /proc/*/fd is not free, so callers
    cache the answer per connection, and ``hint`` (the pid the sender
    claims) is looked at first.
    """
    try:
        address = ipaddress.ip_address(peer_host.split("%", 1)[0])
    except ValueError:
        return None
    address = _unmapped(address)
    if not address.is_loopback:
        return None  # another host's process: nothing in our /proc
    inode = _socket_inode(proc, address, peer_port, local_port)
    return ports.pid_holding(inode, proc, hint) if inode else None


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address):
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _socket_inode(proc: Path, address, local_port: int, remote_port: int) -> int | None:
    for fields in ports.tcp_sockets(proc):
        try:
            local_ip, port = _proc_net_address(fields[1])
            remote_port_here = _proc_net_address(fields[2])[1]
            inode = int(fields[9])
        except ValueError:
            continue
        if port == local_port and remote_port_here == remote_port and local_ip == address and inode:
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


class PidResolver:
    """The host pid of a resource's process (see the module's docs); one per
    receiver, shared by its threads.

    Senders are untrusted and an export may carry thousands of resources, so
    /proc is scanned at most once per ``snapshot_s`` (`hostinfo.ns_processes`),
    indexed by container, pod and cgroup; answers are kept ``ttl_s`` (a
    found pid only while it lives; a miss only until the next scan may
    show a container that just started).

    ``trusted_relays``: the on-host senders whose resources may name any
    process: process names (``comm``, compared on the kernel's 15
    characters) and executable paths (entries with a "/", compared with
    /proc/PID/exe). Any process may set its own name, so a name trusts
    whatever calls itself that; a path, only processes running that file."""

    def __init__(self, proc: Path = Path("/proc"), ttl_s: float = 10.0, snapshot_s: float = 1.0,
                 max_entries: int = 4096, trusted_relays: Iterable[str] = ()):
        self.proc = proc
        self.trusted_relays = tuple(r for r in trusted_relays if r)
        self.ttl_s = ttl_s
        self.snapshot_s = snapshot_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._answers: dict[tuple, tuple[float, int, str]] = {}
        self._scanned_at = -math.inf
        self._by: dict[str, dict[str, list[hostinfo.NsProcess]]] = {}

    def resolve(self, resource: Resource, peer: Callable[[int | None], int | None]) -> tuple[int, str]:
        """(host pid or 0, how); ``peer(hint)`` finds the connection's process
        (None: not on loopback, or gone)."""
        claimed = resource_pid(resource)
        container_id = containers.normal_container_id(resource_string(resource, "container.id"))
        pod_uid = containers.normal_uid(resource_string(resource, "k8s.pod.uid"))
        sender = peer(claimed)
        if not sender:  # not on this host's loopback: the resource is all there is
            return self._claims(claimed, container_id, pod_uid)
        if sender == claimed or (claimed is None and not (container_id or pod_uid)):
            return sender, "process_pid" if claimed else "peer"
        ids = hostinfo.ns_pids(sender, self.proc)
        if claimed is not None and ids and ids[-1] == claimed:
            return sender, "peer_nspid"
        if self._trusted_relay(sender):  # an OpenTelemetry Collector: the resource speaks for itself
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

    def _trusted_relay(self, pid: int) -> bool:
        if not self.trusted_relays:
            return False
        base = self.proc / str(pid)
        try:
            comm = (base / "comm").read_text(errors="replace").rstrip("\n")
        except OSError:
            comm = None
        exe = None
        if any("/" in r for r in self.trusted_relays):
            try:
                exe = os.readlink(base / "exe")
            except OSError:
                pass
        return any(relay == exe if "/" in relay else relay[:15] == comm for relay in self.trusted_relays)

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


# -- HTTP ------------------------------------------------------------------

# gRPC status codes for the google.rpc.Status body OTLP/HTTP asks for on errors.
_GRPC_CODE = {400: 3, 404: 5, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 500: 13}


def _rpc_status(code: int, message: str) -> bytes:
    """google.rpc.Status{code, message} in protobuf wire format, by hand: two
    fields do not justify a dependency on googleapis-common-protos."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    text = message.encode()
    return b"\x08" + varint(code) + b"\x12" + varint(len(text)) + text


def _decode_content(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """Undo Content-Encoding (gzip, deflate) without ever holding more than
    ``max_bytes`` of output: a small bomb cannot fill memory."""
    if encoding in ("", "identity"):
        return body
    # 16+: gzip framing; 32+: zlib or gzip, detected (senders differ on what "deflate" means).
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else 32 + zlib.MAX_WBITS
    out = bytearray()
    data = body
    try:
        while data:  # gzip allows several members back to back
            inflater = zlib.decompressobj(wbits)
            out += inflater.decompress(data, max_bytes + 1 - len(out))
            if len(out) > max_bytes:
                raise OtlpError(413, f"body decompresses to more than {max_bytes} bytes")
            if not inflater.eof:
                raise OtlpError(400, f"truncated {encoding} body")
            data = inflater.unused_data
    except zlib.error as exc:
        raise OtlpError(400, f"malformed {encoding} body: {exc}") from None
    return bytes(out)


class _DeadlineReader(socket.SocketIO):
    """A connection's reading end under one deadline per request.

    A per-recv socket timeout alone does not stop a slowloris: a byte every
    few seconds resets it forever. Here every recv waits only for what is left
    of ``limit_s`` since `start` (called as the receiver starts reading each
    request). ``received`` says whether any of the request had arrived."""

    def __init__(self, sock: socket.socket, limit_s: float):
        super().__init__(sock, "rb")
        self.limit_s = limit_s
        self.deadline = time.monotonic() + limit_s
        self.received = False
        self.timed_out = False

    def start(self) -> None:
        self.deadline = time.monotonic() + self.limit_s
        self.received = self.timed_out = False

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise TimeoutError("request not received in time")
        self._sock.settimeout(left)
        try:
            n = super().readinto(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        finally:
            self._sock.settimeout(self.limit_s)  # for writes: a client that never reads its answer
        self.received = self.received or bool(n)
        return n


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the SDK exporters' connections open between exports; each
    # connection gets its own handler instance, which is where the sending
    # process is cached.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the second waits
    # for the client's delayed ACK, ~40 ms per export on a kept-alive connection.
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, format, *args):  # noqa: A002 - per-request stderr lines; counters instead
        pass

    def setup(self):
        self.timeout = self.server.receiver.read_timeout_s
        super().setup()
        self._reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile.close()  # the plain one StreamRequestHandler made
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self):
        self._reader.start()
        self._answered = False
        super().handle_one_request()  # a timeout there closes the connection
        if self._reader.timed_out and not self._answered:
            TIMEOUTS.labels(partial=str(self._reader.received).lower()).inc()
            if self._reader.received:  # an idle keep-alive connection just goes
                self._send_timeout()

    def _send_timeout(self) -> None:
        """408 for a request cut off while its headers were arriving. Written
        raw: the handler's request state (version, request line) may not exist."""
        HTTP_REQUESTS.labels(code="408").inc()
        text = f"request not received within {self.timeout:g} s\n".encode()
        try:
            self.wfile.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(text), text))
        except OSError:
            pass  # the client left

    def do_POST(self):
        self._answer(self._export)

    def _not_allowed(self):
        if urlsplit(self.path).path == TRACES_PATH:
            raise OtlpError(405, f"{self.command} not allowed: POST OTLP traces")
        raise OtlpError(404, f"no such path {self.path[:100]!r}: POST to {TRACES_PATH}")

    def do_GET(self):
        self._answer(self._not_allowed)

    do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _answer(self, work: Callable[[], bytes]) -> None:
        """Runs ``work`` and answers for it; never raises."""
        self._body_read = False
        self._answered = True
        try:
            status, body = 200, work()
        except OtlpError as exc:
            status, body = exc.status_code, self._error_body(exc.status_code, exc.message)
        except Exception:
            log.exception("OTLP export request failed")
            status, body = 500, self._error_body(500, "internal error")
        HTTP_REQUESTS.labels(code=str(status)).inc()
        if not self._body_read:
            # An unread body would be parsed as the next request: end the connection.
            self.close_connection = True
        try:
            self.send_response(status)
            self.send_header("Content-Type", self._reply_type() or "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            if status == 405:
                self.send_header("Allow", "POST")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the client left; nothing to tell it

    def _reply_type(self) -> str | None:
        try:
            return media_type(self.headers.get("Content-Type"))
        except OtlpError:
            return None

    def _error_body(self, status: int, message: str) -> bytes:
        kind = self._reply_type()
        code = _GRPC_CODE.get(status, 2)
        if kind == PROTOBUF:
            return _rpc_status(code, message)
        if kind == JSON:
            return json.dumps({"code": code, "message": message}).encode()
        return message.encode() + b"\n"

    def _export(self) -> bytes:
        receiver = self.server.receiver
        if urlsplit(self.path).path != TRACES_PATH:
            raise OtlpError(404, f"no such path {self.path[:100]!r}: POST to {TRACES_PATH}")
        kind = media_type(self.headers.get("Content-Type"))
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity", "gzip", "deflate"):
            raise OtlpError(415, f"unsupported content encoding {encoding[:50]!r}: send gzip or none")
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise OtlpError(411, "chunked bodies are not supported: send Content-Length")
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise OtlpError(411, "Content-Length required")
        try:
            length = int(length_header)
        except ValueError:
            raise OtlpError(400, f"bad Content-Length {length_header[:50]!r}") from None
        if length < 0:
            raise OtlpError(400, f"bad Content-Length {length}")
        if length > receiver.max_body_bytes:
            raise OtlpError(413, f"body of {length} bytes is over the {receiver.max_body_bytes}-byte limit")
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            TIMEOUTS.labels(partial="true").inc()
            raise OtlpError(408, f"body not received within {self.timeout:g} s") from None
        if len(body) != length:
            raise OtlpError(400, "body shorter than Content-Length")
        self._body_read = True

        request = parse_export_request(_decode_content(body, encoding, receiver.max_body_bytes), kind)
        converted = spans_to_requests(request, receiver.request_id_attributes,
                                      resolve_pid=lambda resource: receiver.pids.resolve(resource, self._peer_pid))
        SPANS_RECEIVED.inc(sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans))
        SPANS_SKIPPED.inc(converted.skipped)
        for reason, n in converted.rejected.items():
            SPANS_REJECTED.labels(reason=reason).inc(n)
        if converted.records:
            receiver.on_requests(converted.records)
            REQUESTS_PRODUCED.inc(len(converted.records))
        answer = ExportTraceServiceResponse()  # empty: full success
        if converted.rejected:  # OTLP partial success: the sender must not retry the rest
            answer.partial_success.rejected_spans = sum(converted.rejected.values())
            answer.partial_success.error_message = converted.rejection_message()
        if kind == JSON:
            return json_format.MessageToJson(answer, indent=None).encode()
        return answer.SerializeToString()

    def _peer_pid(self, hint: int | None = None) -> int | None:
        if not hasattr(self, "_cached_peer_pid"):
            peer_host, peer_port = self.client_address[:2]
            self._cached_peer_pid = pid_of_peer(
                peer_host, peer_port, self.connection.getsockname()[1], self.server.receiver.proc, hint)
        return self._cached_peer_pid


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most ``slots`` of them at once.

    The accept loop waits for a free slot before accepting the next
    connection, so connections over the cap wait in the kernel's listen
    backlog (sized here well above the cap) instead of holding threads."""

    daemon_threads = True
    request_queue_size = 1024
    receiver: "OtlpReceiver"
    slots: threading.BoundedSemaphore
    stopping = False

    def process_request(self, request, client_address):
        while not self.slots.acquire(timeout=0.1):
            if self.stopping:  # stop() waits for this loop: do not hold it
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)  # starts the thread
        except BaseException:
            self.slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        # Resets and timeouts between requests: count, do not print tracebacks.
        CONNECTION_ERRORS.inc()


class _Server6(_Server):
    address_family = socket.AF_INET6


class OtlpReceiver:
    """OTLP/HTTP trace receiver: POST /v1/traces, protobuf or JSON, optionally
    gzip- or deflate-encoded.

    ``on_requests(records)`` gets each export's request records (dicts of
    RequestSpan fields, see `spans_to_requests`); it is called only when there
    are some, **from the HTTP server's threads, possibly several at once**: it
    must be thread-safe (e.g. put on a queue the collector's loop drains). If
    it raises, the sender gets a 500. ``port=0`` picks a free port, readable
    from ``.port`` after ``start()``. ``max_connections`` connections are
    served at once; each request must arrive within ``read_timeout_s``.
    ``trusted_relays``: see `PidResolver`.
    """

    def __init__(self, host: str, port: int, on_requests: Callable[[list[dict]], None],
                 request_id_attributes: Iterable[str] = DEFAULT_REQUEST_ID_ATTRIBUTES,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, proc: Path = Path("/proc"),
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, trusted_relays: Iterable[str] = ()):
        if max_connections < 1 or not read_timeout_s > 0:
            raise ValueError("max_connections must be >= 1 and read_timeout_s > 0")
        self.host = host
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self._port = port
        self.on_requests = on_requests
        self.request_id_attributes = tuple(request_id_attributes)
        self.max_body_bytes = max_body_bytes
        self.proc = proc
        self.pids = PidResolver(proc, trusted_relays=trusted_relays)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else self._port

    def start(self) -> "OtlpReceiver":
        server_class = _Server6 if ":" in self.host else _Server
        try:
            self._server = server_class((self.host, self._port), _Handler)
        except OSError as exc:
            raise OtlpReceiverUnavailable(
                f"cannot listen for OTLP on {self.host}:{self._port} ({exc.strerror or exc}): "
                "is another collector or OpenTelemetry Collector using the port? choose another OTLP port") from None
        self._server.receiver = self
        self._server.slots = threading.BoundedSemaphore(self.max_connections)
        # A short poll interval: stop() waits for the serving loop to notice.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.stopping = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self._server = self._thread = None

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
