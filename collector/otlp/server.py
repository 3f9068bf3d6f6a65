# SPDX-License-Identifier: Apache-2.0
"""The OTLP/HTTP server: POST /v1/traces in, an OTLP answer out, with its
guards against untrusted bodies and senders (size caps before reading and
after gunzip, a cap on connections, a deadline per request: the package's
docs, ``jitterscope.collector.otlp``).
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import urlsplit

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client import Counter

from jitterscope.collector.otlp.convert import (
    DEFAULT_REQUEST_ID_ATTRIBUTES,
    JSON,
    PROTOBUF,
    OtlpError,
    media_type,
    parse_export_request,
    spans_to_requests,
)
from jitterscope.collector.otlp.pids import PidResolver, pid_of_peer
from jitterscope.common.errors import JitterscopeError

# the package's name, as before the split: log settings that name it still apply
log = logging.getLogger("jitterscope.collector.otlp")

TRACES_PATH = "/v1/traces"
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_READ_TIMEOUT_S = 10.0

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


class OtlpReceiverUnavailable(JitterscopeError):
    """The receiver cannot listen on its address."""


# gRPC status codes for the google.rpc.Status body OTLP/HTTP asks for on errors.
_GRPC_CODE = {400: 3, 404: 5, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}


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


def _trim_spans(request, keep: int) -> int:
    """Cut an ExportTraceServiceRequest to its first ``keep`` spans, in
    place, before they are converted; how many were cut."""
    cut = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            if len(ss.spans) > keep:
                cut += len(ss.spans) - keep
                del ss.spans[keep:]
            keep = max(0, keep - len(ss.spans))
    return cut


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
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        cut = _trim_spans(request, receiver.intake.admit(self._sender(), spans)) if receiver.intake else 0
        converted = spans_to_requests(request, receiver.request_id_attributes,
                                      resolve_pid=lambda resource: receiver.pids.resolve(
                                          resource, self._peer_pid, self.client_address[0]))
        SPANS_RECEIVED.inc(spans)
        SPANS_SKIPPED.inc(converted.skipped)
        for reason, n in converted.rejected.items():
            SPANS_REJECTED.labels(reason=reason).inc(n)
        if converted.records:
            if receiver.intake:
                receiver.intake.put(self._sender(), converted.records)
            else:
                receiver.on_requests(converted.records)
            REQUESTS_PRODUCED.inc(len(converted.records))
        answer = ExportTraceServiceResponse()  # empty: full success
        if converted.rejected or cut:  # OTLP partial success: the sender must not retry the rest
            answer.partial_success.rejected_spans = sum(converted.rejected.values()) + cut
            answer.partial_success.error_message = "; ".join(
                ([converted.rejection_message()] if converted.rejected else []) +
                ([f"{cut} spans over the collector's limits (per request, per sender)"] if cut else []))
        if kind == JSON:
            return json_format.MessageToJson(answer, indent=None).encode()
        return answer.SerializeToString()

    def _sender(self) -> str:
        """Whom the intake limits count this connection against: the uid of
        its process on this host (one user's many processes are one sender),
        else its address."""
        if not hasattr(self, "_cached_sender"):
            self._cached_sender = f"address:{self.client_address[0]}"
            pid = self._peer_pid()
            try:
                status = (self.server.receiver.proc / str(pid) / "status").read_text() if pid else ""
                self._cached_sender = next(f"uid:{line.split()[1]}" for line in status.splitlines()
                                           if line.startswith("Uid:"))
            except (OSError, StopIteration, IndexError):
                pass  # gone, or no pid: its address
        return self._cached_sender

    def _peer_pid(self, hint: int | None = None) -> int | None:
        if not hasattr(self, "_cached_peer_pid"):
            peer_host, peer_port = self.client_address[:2]
            local_host, local_port = self.connection.getsockname()[:2]
            self._cached_peer_pid = pid_of_peer(
                peer_host, peer_port, local_port, self.server.receiver.proc, hint, local_host)
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
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, trusted_relays: Iterable[str] = (),
                 intake=None):
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
        # collector/intake.py: admit(sender, spans) and put(sender, records) instead of on_requests
        self.intake = intake
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
