# SPDX-License-Identifier: Apache-2.0
"""collector/otlp/server.py: the OTLP/HTTP receiver for real, from body to
answer: protobuf and JSON exports become request records, bad bodies get
the right 4xx (never a 500) in the sender's content type, gzip bombs and
oversized bodies are refused, and slow or too many clients cannot hold
the receiver (408 after the deadline, a cap on connections).

The receiver runs for real on 127.0.0.1 port 0 (a local HTTP server, no
broker); the stand-in inference server runs as a subprocess exporting with the
real OpenTelemetry SDK."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
import zlib

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from jitterscope.collector.otlp.convert import JSON, PROTOBUF
from jitterscope.collector.otlp.server import OtlpReceiver, OtlpReceiverUnavailable
from jitterscope.schemas.events import RequestSpan
from tests.fixtures.otlp_builder import (
    FIXTURES, ROOT, SPAN_ID, TRACE, export, metric, post, receiver, span, with_id)  # noqa: F401 - receiver: a fixture

STANDIN = ROOT / "examples" / "inference_standin.py"
HOSTILE = "<script>alert(1)</script>'; DROP TABLE x;--"


# -- the receiver, for real -------------------------------------------------

@pytest.fixture
def relay_receiver():
    """A receiver that trusts this test process as a relay (named by its
    executable), so the spans it posts may name another process (4242)."""
    got: list[dict] = []
    r = OtlpReceiver("127.0.0.1", 0, got.extend, trusted_relays=[os.readlink("/proc/self/exe")])
    r.got = got
    with r:
        yield r


def test_protobuf_export_becomes_request_records(relay_receiver):
    body = export(with_id("cmpl-1", status=Status.STATUS_CODE_OK), pid=4242).SerializeToString()
    status, content_type, answer = post(relay_receiver.port, body)
    assert (status, content_type, answer) == (200, PROTOBUF, b"")  # an empty ExportTraceServiceResponse
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
    assert (status, content_type, json.loads(answer)) == (200, JSON, {})
    server, root = relay_receiver.got
    assert server == {
        "request_id": "cmpl-8c1f2a", "trace_id": "5b8efff798038103d269b633813fc60c",
        "span_id": "eee19b7ec3c1b174", "name": "llm_request", "pid": 4242,
        "start_ns": 1718000000000000000, "end_ns": 1718000002400000000, "status": "ok",
        "queue_ns": 12_500_000, "prefill_ns": 2_050_000_000, "decode_ns": 300_000_000, "ttft_ns": 2_100_000_000,
        "model": "meta-llama/Llama-3.1-8B",
    }
    # A root span of another resource, no request ID, no process.pid: the trace
    # ID names it; the test process sent it over loopback, so it is the pid.
    assert root["request_id"] == root["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert (root["status"], root["pid"], root["name"]) == ("error", os.getpid(), "POST /v1/completions")


def test_invalid_json_over_http_answers_400_in_json(receiver):
    status, content_type, answer = post(receiver.port, b"{not json", "application/json")
    assert (status, content_type) == (400, JSON)
    assert json.loads(answer)["message"].startswith("malformed JSON")


def test_malformed_protobuf_is_a_400_and_counted(receiver):
    before = metric("jitterscope_otlp_http_requests_total", code="400")
    status, content_type, answer = post(receiver.port, b"\x0a\xff\xff\xff\xff\x0f not protobuf")
    assert (status, content_type) == (400, PROTOBUF)
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
    conn.putheader("Content-Type", PROTOBUF)
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
                     headers={"Content-Type": PROTOBUF})
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
    with pytest.raises(OtlpReceiverUnavailable, match="cannot listen"):
        OtlpReceiver("127.0.0.1", receiver.port, lambda records: None).start()


def test_receiver_on_ipv6_loopback():
    got: list[dict] = []
    r = OtlpReceiver("::1", 0, got.extend).start()
    try:
        conn = http.client.HTTPConnection("::1", r.port, timeout=10)
        conn.request("POST", "/v1/traces", body=export(with_id("v6")).SerializeToString(),
                     headers={"Content-Type": PROTOBUF})
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
        except (OSError, ValueError):  # reset, or closed by the test meanwhile (select() of fd -1)
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
        head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
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
                         headers={"Content-Type": PROTOBUF})
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


# -- the stand-in inference server, exporting with the real SDK ------------

def run_standin(port: int, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    popen = subprocess.Popen(
        [sys.executable, str(STANDIN), "--endpoint", f"http://127.0.0.1:{port}/v1/traces",
         "--requests", "5", "--cpu-ms", "2", "--gap-ms", "1", "--times", *args],
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
