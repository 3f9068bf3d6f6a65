"""The collector's OpenTelemetry receiver: OTLP/HTTP traces in, requests out.

Inference servers (vLLM first) export a span per request. Each request span
becomes the fields of a ``jitterscope.schemas.events.RequestSpan`` (everything
but the ``Record`` stamps host/boot_id/seq/ts_ns, which the caller adds; its
``ts_ns`` is the span's end)::

    RequestSpan(**stamp.header(RequestSpan, fields["end_ns"]), **fields)

Which spans are requests: one carrying a request-ID attribute
(``gen_ai.request.id`` by default), else a root or SERVER span, identified
by its trace ID. Other spans (a request's children) are skipped and counted.

The serving process: the resource attribute ``process.pid`` where the SDK
sets it, else the process at the other end of the HTTP connection, looked up
in /proc for loopback peers (`pid_of_peer`), else 0 (host level). A
``process.pid`` is trusted only because the collector listens for this host:
a span relayed from another host would carry that host's pid.

Bodies are untrusted: sizes are capped before reading and after gunzip, parse
errors answer 400, attribute strings are kept verbatim as data (truncated),
and nothing a sender does makes a handler raise. Frequent events are
counters (``jitterscope_otlp_*``), not log lines.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import math
import os
import socket
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterable
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

from jitterscope.errors import JitterscopeError

log = logging.getLogger("jitterscope.collector.otlp")

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
DEFAULT_REQUEST_ID_ATTRIBUTES: tuple[str, ...] = ("gen_ai.request.id",)
DEFAULT_MAX_BODY_BYTES = 4 << 20
MAX_STRING_CHARS = 256  # request IDs and span names longer than this are truncated
MAX_PHASE_S = 86_400.0  # a phase longer than a day is a broken clock, not a slow request
PID_MAX_LIMIT = 1 << 22  # the kernel's ceiling for pid_max

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
                        "spans that did not become requests (child spans, bad ids or times)")
REQUESTS_PRODUCED = Counter("jitterscope_otlp_request_records_total", "request records produced from spans")
CONNECTION_ERRORS = Counter("jitterscope_otlp_connection_errors_total",
                            "connections that failed before a request could be answered")


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

def spans_to_requests(request: ExportTraceServiceRequest,
                      request_id_attributes: Iterable[str] = DEFAULT_REQUEST_ID_ATTRIBUTES,
                      peer_pid: int | None = None) -> tuple[list[dict], int]:
    """The RequestSpan fields (less the Record stamps) of every request span in
    ``request``, and how many spans were skipped. ``peer_pid`` is the sending
    process, used where a resource has no ``process.pid``."""
    request_id_attributes = tuple(request_id_attributes)
    records: list[dict] = []
    skipped = 0
    for resource_spans in request.resource_spans:
        pid = resource_pid(resource_spans.resource) or peer_pid or 0
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                record = _span_to_request(span, pid, request_id_attributes)
                if record is None:
                    skipped += 1
                else:
                    records.append(record)
    return records, skipped


def resource_pid(resource: Resource) -> int | None:
    """The resource's ``process.pid``, where it is a plausible pid."""
    for kv in resource.attributes:
        if kv.key == "process.pid":
            value = _number(kv.value)
            if isinstance(value, int) and 0 < value <= PID_MAX_LIMIT:
                return value
            return None
    return None


def _span_to_request(span: Span, pid: int, request_id_attributes: tuple[str, ...]) -> dict | None:
    # Ids of the wrong length (or all zero) are invalid in OTLP; a record
    # keyed by them would join nothing.
    if len(span.trace_id) != 16 or len(span.span_id) != 8 or not any(span.trace_id):
        return None
    if span.start_time_unix_nano == 0 or span.end_time_unix_nano < span.start_time_unix_nano:
        return None
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

def pid_of_peer(peer_host: str, peer_port: int, local_port: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of the local process at the other end of a loopback TCP
    connection to our ``local_port``, or None.

    Its socket is the one in /proc/net/tcp{,6} whose local end is the peer's
    port and whose remote end is our port; the process is the one holding
    ``socket:[inode]`` among its fds. Needs the right to read other processes'
    fds (root, or the same user). A scan of /proc/*/fd is not free, so callers
    cache the answer per connection.
    """
    try:
        address = ipaddress.ip_address(peer_host.split("%", 1)[0])
    except ValueError:
        return None
    address = _unmapped(address)
    if not address.is_loopback:
        return None  # another host's process: nothing in our /proc
    inode = _socket_inode(proc, address, peer_port, local_port)
    return _pid_holding(proc, f"socket:[{inode}]") if inode else None


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address):
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _socket_inode(proc: Path, address, local_port: int, remote_port: int) -> int | None:
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            try:
                local_ip, port = _proc_net_address(fields[1])
                remote_port_here = _proc_net_address(fields[2])[1]
                inode = int(fields[9])
            except (IndexError, ValueError):
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


def _pid_holding(proc: Path, target: str) -> int | None:
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    for pid in entries:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) == target:
                    return int(pid)
            except OSError:
                continue
    return None


# -- HTTP ------------------------------------------------------------------

# gRPC status codes for the google.rpc.Status body OTLP/HTTP asks for on errors.
_GRPC_CODE = {400: 3, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 500: 13}


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


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the SDK exporters' connections open between exports; each
    # connection gets its own handler instance, which is where the sending
    # process is cached.
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a client may take to send a request (slow senders hold a thread)
    server: "_Server"

    def log_message(self, format, *args):  # noqa: A002 - per-request stderr lines; counters instead
        pass

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
        body = self.rfile.read(length)
        if len(body) != length:
            raise OtlpError(400, "body shorter than Content-Length")
        self._body_read = True

        request = parse_export_request(_decode_content(body, encoding, receiver.max_body_bytes), kind)
        peer_pid = None
        if any(resource_pid(rs.resource) is None for rs in request.resource_spans):
            peer_pid = self._peer_pid()
        records, skipped = spans_to_requests(request, receiver.request_id_attributes, peer_pid)
        SPANS_RECEIVED.inc(sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans))
        SPANS_SKIPPED.inc(skipped)
        if records:
            receiver.on_requests(records)
            REQUESTS_PRODUCED.inc(len(records))
        if kind == JSON:
            return json_format.MessageToJson(ExportTraceServiceResponse()).encode()  # "{}"
        return ExportTraceServiceResponse().SerializeToString()  # empty

    def _peer_pid(self) -> int | None:
        if not hasattr(self, "_cached_peer_pid"):
            peer_host, peer_port = self.client_address[:2]
            self._cached_peer_pid = pid_of_peer(
                peer_host, peer_port, self.connection.getsockname()[1], self.server.receiver.proc)
        return self._cached_peer_pid


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: "OtlpReceiver"

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
    from ``.port`` after ``start()``.
    """

    def __init__(self, host: str, port: int, on_requests: Callable[[list[dict]], None],
                 request_id_attributes: Iterable[str] = DEFAULT_REQUEST_ID_ATTRIBUTES,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, proc: Path = Path("/proc")):
        self.host = host
        self._port = port
        self.on_requests = on_requests
        self.request_id_attributes = tuple(request_id_attributes)
        self.max_body_bytes = max_body_bytes
        self.proc = proc
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
        # A short poll interval: stop() waits for the serving loop to notice.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self._server = self._thread = None

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
