# SPDX-License-Identifier: Apache-2.0
"""collector/otlp.py: OTLP/HTTP trace bodies in, request records out.

The receiver runs for real on 127.0.0.1 port 0 (a local HTTP server, no
broker); the stand-in inference server runs as a subprocess exporting with the
real OpenTelemetry SDK."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import math
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from prometheus_client import REGISTRY

from jitterscope.collector import otlp
from jitterscope.collector.otlp import OtlpError, OtlpReceiver, parse_export_request, pid_of_peer, spans_to_requests
from jitterscope.schemas.events import RequestSpan

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "otlp"
STANDIN = ROOT / "examples" / "inference_standin.py"

TRACE = bytes.fromhex("5b8efff798038103d269b633813fc60c")
SPAN_ID = bytes.fromhex("eee19b7ec3c1b174")
HOSTILE = "<script>alert(1)</script>'; DROP TABLE x;--"


# -- building OTLP bodies ---------------------------------------------------

def any_value(value) -> AnyValue:
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(double_value=value)


def attrs(mapping: dict) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in mapping.items()]


def span(name="llm_request", trace_id=TRACE, span_id=SPAN_ID, parent=b"", kind=Span.SPAN_KIND_SERVER,
         start=1_700_000_000_000_000_000, end=1_700_000_000_075_000_000, status=Status.STATUS_CODE_UNSET,
         **attributes) -> Span:
    return Span(name=name, trace_id=trace_id, span_id=span_id, parent_span_id=parent, kind=kind,
                start_time_unix_nano=start, end_time_unix_nano=end, status=Status(code=status),
                attributes=attrs({k.replace("__", "."): v for k, v in attributes.items()}))


def export(*spans: Span, pid: int | None = None) -> ExportTraceServiceRequest:
    resource = {"service.name": "vllm"} | ({"process.pid": pid} if pid is not None else {})
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=attrs(resource)), scope_spans=[ScopeSpans(spans=list(spans))])])


def with_id(request_id: str, **kw) -> Span:
    return span(**{"gen_ai__request__id": request_id}, **kw)


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- the receiver, for real -------------------------------------------------

@pytest.fixture
def receiver():
    got: list[dict] = []
    r = OtlpReceiver("127.0.0.1", 0, got.extend)
    r.got = got
    with r:
        yield r


@pytest.fixture
def relay_receiver():
    """A receiver that trusts this test process as a relay (named by its
    executable), so the spans it posts may name another process (4242)."""
    got: list[dict] = []
    r = OtlpReceiver("127.0.0.1", 0, got.extend, trusted_relays=[os.readlink("/proc/self/exe")])
    r.got = got
    with r:
        yield r


def post(port: int, body: bytes, content_type: str | None = otlp.PROTOBUF, path: str = "/v1/traces",
         method: str = "POST", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        all_headers = {"Content-Type": content_type} if content_type else {}
        conn.request(method, path, body=body, headers=all_headers | (headers or {}))
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def test_protobuf_export_becomes_request_records(relay_receiver):
    body = export(with_id("cmpl-1", status=Status.STATUS_CODE_OK), pid=4242).SerializeToString()
    status, content_type, answer = post(relay_receiver.port, body)
    assert (status, content_type, answer) == (200, otlp.PROTOBUF, b"")  # an empty ExportTraceServiceResponse
    assert relay_receiver.got == [{
        "request_id": "cmpl-1", "trace_id": TRACE.hex(), "span_id": SPAN_ID.hex(), "name": "llm_request",
        "pid": 4242, "start_ns": 1_700_000_000_000_000_000, "end_ns": 1_700_000_000_075_000_000,
        "status": "ok", "queue_ns": 0, "prefill_ns": 0, "decode_ns": 0, "ttft_ns": 0,
    }]
    # What the caller does with them: stamp and build the schema's record.
    got = relay_receiver.got[0]
    record = RequestSpan(host="h", boot_id="b", seq=1, ts_ns=got["end_ns"], **got)
    assert record.request_id == "cmpl-1"


def test_json_export_with_hex_ids(relay_receiver):
    body = (FIXTURES / "vllm_trace.json").read_bytes()
    status, content_type, answer = post(relay_receiver.port, body, "application/json; charset=utf-8")
    assert (status, content_type, json.loads(answer)) == (200, otlp.JSON, {})
    server, root = relay_receiver.got
    assert server == {
        "request_id": "cmpl-8c1f2a", "trace_id": "5b8efff798038103d269b633813fc60c",
        "span_id": "eee19b7ec3c1b174", "name": "llm_request", "pid": 4242,
        "start_ns": 1718000000000000000, "end_ns": 1718000002400000000, "status": "ok",
        "queue_ns": 12_500_000, "prefill_ns": 2_050_000_000, "decode_ns": 300_000_000, "ttft_ns": 2_100_000_000,
    }
    # A root span of another resource, no request ID, no process.pid: the trace
    # ID names it; the test process sent it over loopback, so it is the pid.
    assert root["request_id"] == root["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert (root["status"], root["pid"], root["name"]) == ("error", os.getpid(), "POST /v1/completions")


def test_json_quirks_parse():
    request = parse_export_request((FIXTURES / "vllm_trace.json").read_bytes(), "application/json")
    first = request.resource_spans[0].scope_spans[0].spans
    assert first[0].trace_id == TRACE and first[1].parent_span_id == SPAN_ID  # upper and lower case hex
    assert first[0].start_time_unix_nano == 1718000000000000000  # int64 as a string
    assert first[1].start_time_unix_nano == 1718000002300000000  # int64 as a number
    assert first[0].kind == Span.SPAN_KIND_SERVER  # integer enum
    assert request.resource_spans[1].scope_spans[0].spans[0].kind == Span.SPAN_KIND_INTERNAL  # enum by name
    # protobuf's own JSON mapping (base64 ids) would be wrong for OTLP: hex is the rule.
    assert parse_export_request(b'{"resourceSpans": []}', "application/json") == ExportTraceServiceRequest()


@pytest.mark.parametrize("body", [
    b"{not json", b"\xff\xfe", b"[]", b'"x"',
    b'{"resourceSpans": 5}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz-not-hex"}]}]}]}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
    b"[" * 100_000,
])
def test_invalid_json_is_a_400(body):
    with pytest.raises(OtlpError) as exc:
        parse_export_request(body, "application/json")
    assert exc.value.status_code == 400


def test_invalid_json_over_http_answers_400_in_json(receiver):
    status, content_type, answer = post(receiver.port, b"{not json", "application/json")
    assert (status, content_type) == (400, otlp.JSON)
    assert json.loads(answer)["message"].startswith("malformed JSON")


def test_malformed_protobuf_is_a_400_and_counted(receiver):
    before = metric("jitterscope_otlp_http_requests_total", code="400")
    status, content_type, answer = post(receiver.port, b"\x0a\xff\xff\xff\xff\x0f not protobuf")
    assert (status, content_type) == (400, otlp.PROTOBUF)
    assert b"malformed protobuf" in answer  # a google.rpc.Status: code 3, then the message
    assert answer.startswith(b"\x08\x03\x12")
    assert metric("jitterscope_otlp_http_requests_total", code="400") == before + 1
    assert receiver.got == []


def test_gzip_and_deflate_bodies(receiver):
    body = export(with_id("zipped"), pid=1).SerializeToString()
    assert post(receiver.port, gzip.compress(body), headers={"Content-Encoding": "gzip"})[0] == 200
    assert post(receiver.port, zlib.compress(body), headers={"Content-Encoding": "deflate"})[0] == 200
    assert [r["request_id"] for r in receiver.got] == ["zipped", "zipped"]
    assert post(receiver.port, b"\x1f\x8b garbage", headers={"Content-Encoding": "gzip"})[0] == 400
    assert post(receiver.port, gzip.compress(body)[:-12], headers={"Content-Encoding": "gzip"})[0] == 400
    assert post(receiver.port, body, headers={"Content-Encoding": "br"})[0] == 415


def test_gzip_bomb_is_a_413():
    r = OtlpReceiver("127.0.0.1", 0, lambda records: None, max_body_bytes=64 * 1024)
    with r:
        bomb = gzip.compress(b"\0" * (10 << 20))  # 10 MiB of zeros in ~10 KiB
        assert len(bomb) < r.max_body_bytes
        assert post(r.port, bomb, headers={"Content-Encoding": "gzip"})[0] == 413


def test_oversized_body_is_refused_before_reading(receiver):
    conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    conn.putrequest("POST", "/v1/traces")
    conn.putheader("Content-Type", otlp.PROTOBUF)
    conn.putheader("Content-Length", str(1 << 30))  # and never send it
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert response.getheader("Connection") == "close"
    conn.close()
    assert post(receiver.port, export(with_id("after"), pid=1).SerializeToString())[0] == 200


def test_unknown_content_type_is_a_415(receiver):
    assert post(receiver.port, b"{}", "text/plain")[0] == 415
    assert post(receiver.port, b"{}", None)[0] == 415


def test_only_post_to_v1_traces(receiver):
    assert post(receiver.port, b"", method="GET")[0] == 405
    assert post(receiver.port, b"", method="PUT")[0] == 405
    assert post(receiver.port, b"", method="GET", path="/")[0] == 404
    assert post(receiver.port, b"", path="/v1/metrics")[0] == 404
    assert post(receiver.port, export(with_id("q"), pid=1).SerializeToString(), path="/v1/traces?x=1")[0] == 200


def test_keep_alive_connection_serves_several_exports(receiver):
    conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    for i in range(3):
        conn.request("POST", "/v1/traces", body=export(with_id(f"k{i}"), pid=1).SerializeToString(),
                     headers={"Content-Type": otlp.PROTOBUF})
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"")
    conn.close()
    assert [r["request_id"] for r in receiver.got] == ["k0", "k1", "k2"]


def test_a_failing_callback_answers_500_and_the_receiver_lives_on():
    calls = []

    def on_requests(records):
        calls.append(records)
        if len(calls) == 1:
            raise RuntimeError("queue full")

    before = metric("jitterscope_otlp_http_requests_total", code="500")
    with OtlpReceiver("127.0.0.1", 0, on_requests) as r:
        body = export(with_id("x"), pid=1).SerializeToString()
        assert post(r.port, body)[0] == 500
        assert post(r.port, body)[0] == 200
    assert metric("jitterscope_otlp_http_requests_total", code="500") == before + 1


def test_counters_count_spans_and_records(receiver):
    names = ["jitterscope_otlp_spans_received_total", "jitterscope_otlp_spans_skipped_total",
             "jitterscope_otlp_request_records_total"]
    before = [metric(n) for n in names]
    child = span(name="decode_step", span_id=b"\1" * 8, parent=SPAN_ID, kind=Span.SPAN_KIND_INTERNAL)
    post(receiver.port, export(with_id("c"), child, pid=1).SerializeToString())
    assert [metric(n) - b for n, b in zip(names, before)] == [2, 1, 1]


def test_hostile_request_id_is_kept_verbatim(receiver):
    post(receiver.port, export(with_id(HOSTILE, name=HOSTILE), pid=1).SerializeToString())
    assert receiver.got[0]["request_id"] == HOSTILE and receiver.got[0]["name"] == HOSTILE


def test_receiver_refuses_a_taken_port(receiver):
    with pytest.raises(otlp.OtlpReceiverUnavailable, match="cannot listen"):
        OtlpReceiver("127.0.0.1", receiver.port, lambda records: None).start()


def test_receiver_on_ipv6_loopback():
    got: list[dict] = []
    r = OtlpReceiver("::1", 0, got.extend).start()
    try:
        conn = http.client.HTTPConnection("::1", r.port, timeout=10)
        conn.request("POST", "/v1/traces", body=export(with_id("v6")).SerializeToString(),
                     headers={"Content-Type": otlp.PROTOBUF})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        r.stop()
    assert got[0]["request_id"] == "v6" and got[0]["pid"] == os.getpid()  # found from the ::1 connection


# -- slow and too many clients --------------------------------------------

def wait_for(condition, timeout: float, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return condition()


def handler_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


class SlowClient(threading.Thread):
    """Sends ``head`` at once, then one more byte of a never-ending header
    every ``gap`` seconds until the receiver answers or hangs up; keeps what
    came back and when."""

    def __init__(self, port: int, head: bytes = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n", gap: float = 0.05,
                 trickle: bytes = b"X-Slow: " + b"a" * 60_000):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.head, self.gap, self.trickle = head, gap, trickle
        self.started = time.monotonic()
        self.answer = b""
        self.elapsed: float | None = None

    def run(self):
        try:
            self.sock.sendall(self.head)
            for i in range(len(self.trickle)):
                if select.select([self.sock], [], [], self.gap)[0]:
                    break  # an answer, or the end of the connection
                if self.trickle:
                    self.sock.sendall(self.trickle[i:i + 1])
            self.sock.settimeout(5)
            while chunk := self.sock.recv(4096):
                self.answer += chunk
        except OSError:
            pass
        finally:
            self.elapsed = time.monotonic() - self.started
            self.sock.close()


def test_slow_headers_get_408_within_the_timeout():
    before = metric("jitterscope_otlp_http_requests_total", code="408")
    with OtlpReceiver("127.0.0.1", 0, lambda records: None, read_timeout_s=0.5) as r:
        slow = SlowClient(r.port)
        slow.start()
        slow.join(10)
        assert slow.answer.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in slow.answer
        assert 0.5 <= slow.elapsed < 0.5 + 1.0
        assert metric("jitterscope_otlp_http_requests_total", code="408") == before + 1
        assert post(r.port, export(with_id("after"), pid=1).SerializeToString())[0] == 200


def test_slow_body_gets_408_not_500(caplog):
    errors = [metric("jitterscope_otlp_http_requests_total", code="500"),
              metric("jitterscope_otlp_connection_errors_total")]
    got: list[dict] = []
    with OtlpReceiver("127.0.0.1", 0, got.extend, read_timeout_s=0.5) as r:
        body = export(with_id("slow"), pid=1).SerializeToString()
        head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {otlp.PROTOBUF}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        slow = SlowClient(r.port, head=head + body[:5], trickle=b"")
        slow.start()  # the body's first 5 bytes, then nothing
        slow.join(10)
        trickled = SlowClient(r.port, head=head, gap=0.05, trickle=body)  # a byte every 50 ms: too slow
        trickled.start()
        trickled.join(10)
        for client in (slow, trickled):
            assert client.answer.startswith(b"HTTP/1.1 408 "), client.answer[:100]
            assert client.answer.split(b"\r\n\r\n", 1)[1].startswith(b"\x08\x04\x12")  # DEADLINE_EXCEEDED
            assert client.elapsed < 0.5 + 1.0
        assert got == []
    assert [metric("jitterscope_otlp_http_requests_total", code="500"),
            metric("jitterscope_otlp_connection_errors_total")] == errors
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]


def test_idle_connection_is_closed_quietly():
    with OtlpReceiver("127.0.0.1", 0, lambda records: None, read_timeout_s=0.3) as r:
        with socket.create_connection(("127.0.0.1", r.port)) as sock:
            sock.settimeout(5)
            started = time.monotonic()
            assert sock.recv(100) == b""  # no 408 to a client that asked nothing
            assert 0.3 <= time.monotonic() - started < 1.3


def test_keep_alive_connection_outlives_the_timeout_between_quick_requests():
    with OtlpReceiver("127.0.0.1", 0, lambda records: None, read_timeout_s=0.4) as r:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        for _ in range(4):  # 4 x 0.2 s on one connection: the deadline is per request
            conn.request("POST", "/v1/traces", body=export(with_id("k"), pid=1).SerializeToString(),
                         headers={"Content-Type": otlp.PROTOBUF})
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b"")
            time.sleep(0.2)
        conn.close()


def test_slowloris_cannot_hold_more_than_the_cap():
    """2 x cap slow clients: never more than cap handler threads; each slow
    one gets 408 after the timeout; a normal export queued behind them is
    served once slots free (after about two timeouts: two waves ahead of it)."""
    cap, timeout = 4, 1.0
    got: list[dict] = []
    with OtlpReceiver("127.0.0.1", 0, got.extend, max_connections=cap, read_timeout_s=timeout) as r:
        base = handler_threads()
        slow = [SlowClient(r.port) for _ in range(2 * cap)]
        for client in slow:
            client.start()
        assert wait_for(lambda: handler_threads() - base == cap, 5)
        most = 0
        started = time.monotonic()
        result: list = []
        normal = threading.Thread(target=lambda: result.append(
            post(r.port, export(with_id("patient"), pid=1).SerializeToString())))
        normal.start()
        while normal.is_alive() and time.monotonic() - started < 15:
            most = max(most, handler_threads() - base)
            time.sleep(0.01)
        normal.join(1)
        waited = time.monotonic() - started
        assert result and result[0][0] == 200
        assert [x["request_id"] for x in got] == ["patient"]
        assert most <= cap
        assert waited < 2 * timeout + 2.0, waited
        for client in slow:
            client.join(10)
            assert client.answer.startswith(b"HTTP/1.1 408 ")
            assert client.elapsed < 2 * timeout + 2.0
        print(f"normal export waited {waited:.2f} s behind {2 * cap} slow clients (cap {cap}, timeout {timeout} s)")


def test_stop_does_not_hang_with_clients_waiting_for_a_slot():
    r = OtlpReceiver("127.0.0.1", 0, lambda records: None, max_connections=1, read_timeout_s=5).start()
    clients = [SlowClient(r.port) for _ in range(3)]
    for client in clients:
        client.start()
    assert wait_for(lambda: handler_threads() >= 1, 5)
    started = time.monotonic()
    r.stop()
    assert time.monotonic() - started < 2
    for client in clients:
        client.sock.close()


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        OtlpReceiver("127.0.0.1", 0, lambda records: None, max_connections=0)
    with pytest.raises(ValueError):
        OtlpReceiver("127.0.0.1", 0, lambda records: None, read_timeout_s=0)


# -- spans to requests ------------------------------------------------------

def test_span_without_process_pid_gets_the_peer_pid():
    records, _, _ = spans_to_requests(export(with_id("a")), peer_pid=777)
    assert records[0]["pid"] == 777
    records, _, _ = spans_to_requests(export(with_id("a"), pid=4242), peer_pid=777)
    assert records[0]["pid"] == 4242  # the SDK's own word wins
    records, _, _ = spans_to_requests(export(with_id("a")), peer_pid=None)
    assert records[0]["pid"] == 0  # host level
    records, _, _ = spans_to_requests(export(with_id("a"), pid=-5), peer_pid=777)
    assert records[0]["pid"] == 777  # not a pid
    records, _, _ = spans_to_requests(export(with_id("a"), pid=2**32), peer_pid=777)
    assert records[0]["pid"] == 777  # would not fit the U32 column


def test_root_span_without_request_id_is_named_by_its_trace():
    root = span(kind=Span.SPAN_KIND_INTERNAL)
    server_child = span(span_id=b"\2" * 8, parent=SPAN_ID, kind=Span.SPAN_KIND_SERVER)
    child = span(span_id=b"\3" * 8, parent=SPAN_ID, kind=Span.SPAN_KIND_CLIENT)
    child_with_id = with_id("cmpl-9", span_id=b"\4" * 8, parent=SPAN_ID, kind=Span.SPAN_KIND_INTERNAL)
    records, skipped, rejected = spans_to_requests(export(root, server_child, child, child_with_id))
    assert [(r["request_id"], r["span_id"]) for r in records] == [
        (TRACE.hex(), SPAN_ID.hex()), (TRACE.hex(), "02" * 8), ("cmpl-9", "04" * 8)]
    assert (skipped, rejected) == (1, {})  # a child span is valid, just not a request


def test_request_id_attributes_are_configurable():
    s = span()
    s.attributes.extend(attrs({"x-request-id": "from-header", "gen_ai.request.id": "from-vllm", "seq.no": 42}))
    records, _, _ = spans_to_requests(export(s), ["x-request-id", "gen_ai.request.id"])
    assert records[0]["request_id"] == "from-header"
    records, _, _ = spans_to_requests(export(s), ["missing", "seq.no"])
    assert records[0]["request_id"] == "42"  # an integer ID, as text
    records, _, _ = spans_to_requests(export(with_id("")), ["gen_ai.request.id"])
    assert records[0]["request_id"] == TRACE.hex()  # an empty ID is no ID


def test_vllm_phases_in_seconds_become_ns():
    s = span(**{"gen_ai__latency__time_in_queue": 0.25, "gen_ai__latency__time_in_model_prefill": 1,
                "gen_ai__latency__time_in_model_decode": 0.5e-3, "gen_ai__latency__time_to_first_token": 1.3})
    (record,), _, _ = spans_to_requests(export(s))
    assert (record["queue_ns"], record["prefill_ns"], record["decode_ns"], record["ttft_ns"]) == (
        250_000_000, 1_000_000_000, 500_000, 1_300_000_000)


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, 1e12, "0.5", True])
def test_implausible_phases_are_zero(value):
    (record,), _, _ = spans_to_requests(export(span(**{"gen_ai__latency__time_in_queue": value})))
    assert record["queue_ns"] == 0


@pytest.mark.parametrize("code, status", [
    (Status.STATUS_CODE_OK, "ok"), (Status.STATUS_CODE_ERROR, "error"),
    (Status.STATUS_CODE_UNSET, "unset"), (7, "unset"),  # a code from the future
])
def test_status(code, status):
    (record,), _, _ = spans_to_requests(export(span(status=code)))
    assert record["status"] == status


NOW_NS = 1_700_000_000_000_000_000
DAY_NS = 86_400 * 10**9

BAD_SPANS = {  # id -> (span fields, the reason it is rejected for)
    "no-start": (dict(start=0), "no_start_time"),
    "both-zero": (dict(start=0, end=0), "no_start_time"),
    "end-before-start": (dict(start=10, end=9), "end_before_start"),
    "end-2^63": (dict(end=2**63), "time_out_of_range"),
    "end-2^64-1": (dict(end=2**64 - 1), "time_out_of_range"),
    "both-past-2262": (dict(start=2**63 + 1, end=2**63 + 2), "time_out_of_range"),
    "end-a-week-ahead": (dict(end=NOW_NS + 7 * DAY_NS), "time_in_future"),
    "no-trace-id": (dict(trace_id=b""), "bad_ids"),
    "zero-trace-id": (dict(trace_id=b"\0" * 16), "bad_ids"),
    "long-trace-id": (dict(trace_id=b"\1" * 17), "bad_ids"),
    "short-span-id": (dict(span_id=b"\1" * 7), "bad_ids"),
}


@pytest.mark.parametrize("bad, reason", BAD_SPANS.values(), ids=BAD_SPANS.keys())
def test_spans_with_bad_times_or_ids_are_rejected(bad, reason):
    converted = spans_to_requests(export(with_id("r", **bad)), now_ns=NOW_NS)
    assert converted == ([], 0, {reason: 1})
    assert converted.rejection_message() == f"1 spans rejected: 1 {reason.replace('_', ' ')}"


@pytest.mark.parametrize("start, end", [
    (1, 1),  # an old clock still joins: spans and kernel events share it
    (NOW_NS, NOW_NS),
    (NOW_NS, NOW_NS + DAY_NS),  # up to a day of clock skew
])
def test_edge_times_are_kept(start, end):
    (record,), _, rejected = spans_to_requests(export(with_id("r", start=start, end=end)), now_ns=NOW_NS)
    assert (record["start_ns"], record["end_ns"], rejected) == (start, end, {})


def test_future_bound_is_capped_at_the_store_limit():
    (_, _, rejected) = spans_to_requests(export(span(end=2**63)), now_ns=2**63 - 10)
    assert rejected == {"time_out_of_range": 1}
    (record,), _, _ = spans_to_requests(export(span(end=2**63 - 1)), now_ns=2**63 - 10)
    assert record["end_ns"] == 2**63 - 1  # DateTime64(9)'s last nanosecond


def test_every_bad_time_over_http_is_rejected_alone_and_counted(receiver):
    """Each bad span among good ones: the good ones are kept, the answer is an
    OTLP partial success naming the count, and the reason is counted."""
    now = time.time_ns()
    for i, (name, (bad, reason)) in enumerate(BAD_SPANS.items()):
        if reason == "time_in_future":
            bad = dict(start=now, end=now + 7 * DAY_NS)
        before = metric("jitterscope_otlp_spans_rejected_total", reason=reason)
        good = [with_id(f"{name}-good{j}", span_id=bytes([j + 1]) * 8) for j in range(2)]
        body = export(good[0], with_id(f"{name}-bad", **bad), good[1], pid=1).SerializeToString()
        status, content_type, answer = post(receiver.port, body)
        assert (status, content_type) == (200, otlp.PROTOBUF), name
        response = otlp.ExportTraceServiceResponse.FromString(answer)
        assert response.partial_success.rejected_spans == 1, name
        assert reason.replace("_", " ") in response.partial_success.error_message
        assert metric("jitterscope_otlp_spans_rejected_total", reason=reason) == before + 1
        assert [r["request_id"] for r in receiver.got[-2:]] == [f"{name}-good0", f"{name}-good1"]
        assert len(receiver.got) == 2 * (i + 1)  # the bad one never reached the callback
    for record in receiver.got:  # and what did fits the store
        RequestSpan(host="h", boot_id="b", seq=1, ts_ns=record["end_ns"], **record)


def test_rejected_spans_in_json_answer_partial_success(receiver):
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": TRACE.hex(), "spanId": SPAN_ID.hex(), "name": "ok", "kind": 2,
         "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000075000000"},
        {"traceId": TRACE.hex(), "spanId": "01" * 8, "name": "poison", "kind": 2,
         "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": str(2**63)},
        {"traceId": TRACE.hex(), "spanId": "02" * 8, "name": "backwards", "kind": 2,
         "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1"},
    ]}]}]}
    status, content_type, answer = post(receiver.port, json.dumps(document).encode(), "application/json")
    assert (status, content_type) == (200, otlp.JSON)
    partial = json.loads(answer)["partialSuccess"]
    assert partial["rejectedSpans"] == "2"  # int64 is a string in OTLP JSON
    assert "1 end before start" in partial["errorMessage"] and "1 time out of range" in partial["errorMessage"]
    assert [r["name"] for r in receiver.got] == ["ok"]


def test_all_good_spans_answer_plain_success(receiver):
    status, _, answer = post(receiver.port, export(with_id("fine"), pid=1).SerializeToString())
    assert (status, answer) == (200, b"")  # no partial_success field at all


def test_long_strings_are_truncated():
    (record,), _, _ = spans_to_requests(export(with_id("i" * 10_000, name="n" * 10_000)))
    assert record["request_id"] == "i" * otlp.MAX_STRING_CHARS and record["name"] == "n" * otlp.MAX_STRING_CHARS


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


# -- the stand-in inference server, exporting with the real SDK ------------

def run_standin(port: int, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    popen = subprocess.Popen(
        [sys.executable, str(STANDIN), "--endpoint", f"http://127.0.0.1:{port}/v1/traces",
         "--requests", "5", "--cpu-ms", "2", "--gap-ms", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = popen.communicate(timeout=120)
    assert popen.returncode == 0, stderr
    return subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr), popen.pid


@pytest.mark.parametrize("args", [[], ["--no-pid"]], ids=["process.pid", "pid-from-connection"])
def test_standin_requests_arrive_with_its_pid(receiver, args):
    done, pid = run_standin(receiver.port, "--id-prefix", "standin-", *args)
    printed = [line.split() for line in done.stdout.splitlines()]
    assert [p[0] for p in printed] == [f"standin-{i}" for i in range(5)]
    by_id = {r["request_id"]: r for r in receiver.got}
    assert sorted(by_id) == sorted(p[0] for p in printed)
    for request_id, start_ns, end_ns in printed:
        record = by_id[request_id]
        assert (record["start_ns"], record["end_ns"]) == (int(start_ns), int(end_ns))
        assert (record["pid"], record["name"], record["status"]) == (pid, "llm_request", "ok")
        assert record["prefill_ns"] >= 1_000_000 and record["ttft_ns"] == record["prefill_ns"]


# -- pids of senders in containers (tests/fixtures/host-containers) ----------

CPROC = ROOT / "tests" / "fixtures" / "host-containers" / "proc"
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
    hints = []
    resolver = otlp.PidResolver(CPROC)
    assert resolver.resolve(resource(**attributes), lambda hint: hints.append(hint) or peer) == answer
    assert hints == [attributes.get("process__pid")]  # the claimed pid is the scan's first guess


def test_pid_resolver_forgets_a_process_that_exited(tmp_path):
    proc = tmp_path / "proc"
    shutil.copytree(CPROC, proc)
    resolver = otlp.PidResolver(proc, snapshot_s=0)
    span_resource = resource(process__pid=7, container__id=DOCKER_ID)
    assert resolver.resolve(span_resource, lambda hint: None) == (2002, "nspid")
    shutil.rmtree(proc / "2002")
    assert resolver.resolve(span_resource, lambda hint: None) == (2001, "container")


def test_resolved_pids_are_counted_per_request():
    def resolve(res):
        return otlp.PidResolver(CPROC).resolve(res, lambda hint: None)

    before = metric("jitterscope_otlp_pid_resolved_total", how="nspid")
    request = export(with_id("a"), with_id("b", span_id=b"\x01" * 8), with_id("c", span_id=b"\x02" * 8, parent=b"\x03" * 8))
    request.resource_spans[0].resource.CopyFrom(resource(process__pid=7, container__id=DOCKER_ID))
    records, _, _ = spans_to_requests(request, resolve_pid=resolve)
    assert {r["pid"] for r in records} == {2002} and len(records) == 3
    assert metric("jitterscope_otlp_pid_resolved_total", how="nspid") == before + 3


def test_receiver_translates_a_container_pid_over_http():
    got: list[dict] = []
    before = metric("jitterscope_otlp_pid_resolved_total", how="nspid")
    request = export(with_id("from-a-container"))
    request.resource_spans[0].resource.CopyFrom(
        resource(service__name="vllm", process__pid=7, container__id=DOCKER_ID))
    # proc is the fixture: the connection's owner is not in it (as from another network namespace)
    with OtlpReceiver("127.0.0.1", 0, got.extend, proc=CPROC) as r:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        conn.request("POST", "/v1/traces", request.SerializeToString(), {"Content-Type": otlp.PROTOBUF})
        assert conn.getresponse().status == 200
        conn.close()
    assert [(g["request_id"], g["pid"]) for g in got] == [("from-a-container", 2002)]
    assert metric("jitterscope_otlp_pid_resolved_total", how="nspid") == before + 1


def test_a_flood_of_unknown_containers_scans_proc_once(monkeypatch):
    """An export may carry thousands of resources: /proc is scanned at most
    once per snapshot period, whatever the senders claim."""
    from jitterscope.collector import hostinfo
    scans = []
    real = hostinfo.ns_processes
    monkeypatch.setattr(hostinfo, "ns_processes", lambda proc: scans.append(proc) or real(proc))
    resolver = otlp.PidResolver(CPROC, snapshot_s=60)
    answers = {resolver.resolve(resource(process__pid=7, container__id=f"{i:064x}"), lambda hint: None)
               for i in range(2000)}
    assert answers == {(0, "unresolved")} and len(scans) == 1
    # short IDs and the kubelet's "containerd://" spelling find the container in that same scan
    assert resolver.resolve(resource(process__pid=7, container__id=DOCKER_ID[:12]), lambda hint: None) == (2002, "nspid")
    assert resolver.resolve(resource(process__pid=1, container__id="containerd://" + DOCKER_ID.upper()),
                            lambda hint: None) == (2001, "nspid")
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
    resolver = otlp.PidResolver(senders_proc, trusted_relays=["otelcol"])
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
    resolver = otlp.PidResolver(CPROC)
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
    resolver = otlp.PidResolver(senders_proc, trusted_relays=relays)
    assert resolver.resolve(resource(**attributes), lambda hint: 900) == answer


def test_a_relay_named_by_path_is_not_whoever_takes_its_name(senders_proc):
    """Any process can call itself otelcol-contrib; only the named file runs as the relay."""
    claim = resource(process__pid=1)
    assert otlp.PidResolver(senders_proc, trusted_relays=[RELAY_EXE]).resolve(claim, lambda hint: 902) == (
        902, "refused_claim")
    assert otlp.PidResolver(senders_proc, trusted_relays=[]).resolve(claim, lambda hint: 900) == (
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
    assert otlp.PidResolver(CPROC).resolve(resource(**attributes), lambda hint: sender) == answer


def test_a_receiver_passes_its_trusted_relays_on():
    assert OtlpReceiver("127.0.0.1", 0, list.extend, trusted_relays=["otelcol"]).pids.trusted_relays == ("otelcol",)
