# SPDX-License-Identifier: Apache-2.0
"""Fuzzing the OTLP receiver over real HTTP on loopback.

A few thousand bodies, from a seeded random generator (a failure replays):
valid exports with edge-case times, ids and attributes, then mutated at the
byte level (bit flips, truncation, splices, huge varints, random bytes) or at
the JSON level (values replaced by wrong types and out-of-range numbers), sent
with right and wrong content types and encodings (including gzip garbage).

What must hold for every one: no 500, no exception in a handler (connection
errors counter and error logs unchanged), every record that reaches the
callback validates as a RequestSpan (times within DateTime64(9), pid a U32,
phases U64), and afterwards the receiver still serves a valid export.
"""

from __future__ import annotations

import base64
import copy
import gzip
import http.client
import json
import logging
import random
import time
import zlib
from pathlib import Path

import msgspec
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from prometheus_client import REGISTRY

from jitterscope.collector.otlp.convert import JSON, MAX_FUTURE_NS, PHASE_ATTRIBUTES, PROTOBUF
from jitterscope.collector.otlp.server import OtlpReceiver
from jitterscope.schemas.events import MAX_EPOCH_NS, RequestSpan

SEED = 20240611
CASES = 3000  # ~4 s on an idle 2-core VM
BUDGET_S = 15.0  # on a loaded one, the seeded sequence's first cases that fit (at least MIN_CASES)
MIN_CASES = 500
FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "otlp" / "vllm_trace.json"
NOW_NS = time.time_ns()
DAY_NS = 86_400 * 10**9
EDGE_TIMES = [0, 1, NOW_NS, NOW_NS + DAY_NS // 2, NOW_NS + 2 * DAY_NS, MAX_EPOCH_NS - 1, MAX_EPOCH_NS,
              2**63, 2**63 + 1, 2**64 - 1]
EDGE_INTS = [0, -1, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), 2**64 - 1]
EDGE_NUMBERS = [-1.0, 0.0, 1e-9, 86_400.0, 86_400.1, 1e300, float("inf"), float("-inf"), float("nan")]


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- valid bodies, with edge values -----------------------------------------

def random_value(rng: random.Random) -> AnyValue:
    kind = rng.randrange(4)
    if kind == 0:
        return AnyValue(int_value=rng.choice([v for v in EDGE_INTS if -(2**63) <= v < 2**63]))
    if kind == 1:
        return AnyValue(double_value=rng.choice(EDGE_NUMBERS + [rng.uniform(0, 5)]))
    if kind == 2:
        return AnyValue(string_value=rng.choice(["", "x" * 1000, "\x1b[31m", "cmpl-1", "\u202e"]))
    return AnyValue(bool_value=True)


def random_span(rng: random.Random, i: int) -> Span:
    start = rng.choice(EDGE_TIMES + [NOW_NS - rng.randrange(10**12)] * 5)
    end = rng.choice([start, start + rng.randrange(10**10), rng.choice(EDGE_TIMES), max(start - 1, 0)])
    end = min(end, 2**64 - 1)
    keys = list(PHASE_ATTRIBUTES.values()) + ["gen_ai.request.id", "other"]
    return Span(
        trace_id=rng.choice([rng.randbytes(16)] * 6 + [b"", b"\0" * 16, rng.randbytes(17)]),
        span_id=rng.choice([rng.randbytes(8)] * 6 + [b"", rng.randbytes(7)]),
        parent_span_id=rng.choice([b"", rng.randbytes(8)]),
        name=rng.choice(["llm_request", "", "n" * 500]),
        kind=rng.choice([0, 1, 2, 3, 99]),
        start_time_unix_nano=start, end_time_unix_nano=end,
        status=Status(code=rng.choice([0, 1, 2, 7])),
        attributes=[KeyValue(key=rng.choice(keys), value=random_value(rng)) for _ in range(rng.randrange(5))])


def random_export(rng: random.Random) -> ExportTraceServiceRequest:
    resources = []
    for _ in range(rng.randrange(1, 3)):
        attributes = [KeyValue(key="service.name", value=AnyValue(string_value="vllm"))]
        if rng.random() < 0.7:
            attributes.append(KeyValue(key="process.pid", value=random_value(rng) if rng.random() < 0.5
                                       else AnyValue(int_value=rng.choice(EDGE_INTS[:9]))))
        spans = [random_span(rng, i) for i in range(rng.randrange(0, 5))]
        resources.append(ResourceSpans(resource=Resource(attributes=attributes),
                                       scope_spans=[ScopeSpans(spans=spans)]))
    return ExportTraceServiceRequest(resource_spans=resources)


def as_otlp_json(request: ExportTraceServiceRequest) -> dict:
    """OTLP JSON: protobuf's JSON mapping, but ids in hex."""
    document = json.loads(json_format.MessageToJson(request))
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


# -- mutations --------------------------------------------------------------

def huge_varint(rng: random.Random) -> bytes:
    return rng.choice([b"\xff" * 9 + b"\x01", b"\xff" * 10 + b"\x7f", b"\x80" * 20, b"\xff\xff\xff\xff\x0f"])


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:  # bit flips
            for _ in range(rng.randrange(1, 9)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncation
            del data[at:]
        elif op == 2:  # a huge or endless varint, inserted or overwriting a length
            data[at:at + rng.randrange(3)] = huge_varint(rng)
        elif op == 3:  # random bytes
            data[at:at] = rng.randbytes(rng.randrange(1, 64))
        elif op == 4 and data:  # splice: a slice repeated elsewhere
            i = rng.randrange(len(data))
            data[at:at] = data[i:i + rng.randrange(1, 200)] * rng.randrange(1, 4)
        else:  # a field tag with a giant length
            data[at:at] = bytes([rng.choice([0x0A, 0x12, 0x1A, 0x22, 0x39, 0x41])]) + huge_varint(rng)
    return bytes(data)


WRONG_JSON = [None, True, -1, 2**63, 2**64, 2**70, -(2**64), 1.5e308, "x", "", "-1", "1e30", "18446744073709551616",
              [], {}, [[[[[]]]]], {"a": {"b": {}}}]


def mutate_json(rng: random.Random, document: dict) -> dict:
    document = copy.deepcopy(document)
    nodes: list[tuple[object, object]] = []

    def walk(node):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in list(items):
            nodes.append((node, key))
            walk(child)

    walk(document)
    for _ in range(rng.randrange(1, 4)):
        if not nodes:
            break
        parent, key = rng.choice(nodes)
        if isinstance(key, str) and key.endswith("UnixNano") and rng.random() < 0.5:
            parent[key] = rng.choice([str(rng.choice(EDGE_TIMES)), rng.choice(EDGE_TIMES), str(-1)])
        else:
            parent[key] = copy.deepcopy(rng.choice(WRONG_JSON))
    return document


BOMB = gzip.compress(b"\0" * (1 << 20))


def gzip_garbage(rng: random.Random, body: bytes) -> bytes:
    packed = gzip.compress(body) if rng.random() < 0.5 else zlib.compress(body)
    choice = rng.randrange(5)
    if choice == 4:
        return BOMB  # decompresses past the body limit
    if choice == 0:
        return mutate_bytes(rng, packed)
    if choice == 1:
        return packed[:rng.randrange(len(packed))]
    if choice == 2:
        return b"\x1f\x8b" + rng.randbytes(rng.randrange(64))
    return packed + rng.randbytes(rng.randrange(1, 16))  # trailing junk after a member


def fuzz_case(rng: random.Random, base_json: dict) -> tuple[bytes, dict]:
    """One body and its headers."""
    request = random_export(rng)
    is_json = rng.random() < 0.35
    if is_json:
        document = as_otlp_json(request) if rng.random() < 0.7 else copy.deepcopy(base_json)
        body = json.dumps(mutate_json(rng, document) if rng.random() < 0.6 else document).encode()
        content_type = JSON
    else:
        body = request.SerializeToString()
        content_type = PROTOBUF
    kind = rng.randrange(10)
    if kind <= 3:
        body = mutate_bytes(rng, body)
    elif kind == 4:
        body = rng.randbytes(rng.randrange(0, 2000))
    headers = {"Content-Type": content_type}
    roll = rng.random()
    if roll < 0.1:  # the other, or a wrong, content type
        headers["Content-Type"] = rng.choice([JSON if not is_json else PROTOBUF, "text/plain", "",
                                              "application/x-protobuf; charset=\x7f", "application/grpc"])
    elif roll < 0.25:  # compressed, maybe broken
        encoding = rng.choice(["gzip", "deflate"])
        headers["Content-Encoding"] = encoding
        body = gzip_garbage(rng, body) if rng.random() < 0.6 else (
            gzip.compress(body) if encoding == "gzip" else zlib.compress(body))
    elif roll < 0.28:
        headers["Content-Encoding"] = rng.choice(["br", "gzip, gzip", "identity"])
    return body, headers


# -- the test -----------------------------------------------------------------

ANSWERS = {200, 400, 413, 415}


def test_fuzzed_bodies_never_break_the_receiver(caplog):
    rng = random.Random(SEED)
    base_json = json.loads(FIXTURE.read_bytes())
    got: list[dict] = []
    caplog.set_level(logging.WARNING)
    before = {name: metric(name, **labels) for name, labels in [
        ("jitterscope_otlp_http_requests_total", {"code": "500"}),
        ("jitterscope_otlp_connection_errors_total", {}),
    ]}
    statuses: dict[int, int] = {}
    rejected = 0
    started = time.monotonic()
    with OtlpReceiver("127.0.0.1", 0, got.extend, max_body_bytes=256 * 1024, read_timeout_s=5) as r:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        for case in range(CASES):
            if time.monotonic() - started > BUDGET_S:
                break
            body, headers = fuzz_case(rng, base_json)
            try:
                conn.request("POST", "/v1/traces", body=body, headers=headers)
                response = conn.getresponse()
                answer = response.read()
            except (http.client.HTTPException, OSError) as exc:
                pytest.fail(f"case {case}: the connection broke ({exc!r}) on {headers} {body[:80]!r}")
            statuses[response.status] = statuses.get(response.status, 0) + 1
            assert response.status in ANSWERS, (case, response.status, answer[:200], headers, body[:200])
            if response.status == 200 and headers["Content-Type"] == PROTOBUF:
                rejected += ExportTraceServiceResponse.FromString(answer).partial_success.rejected_spans
            if response.getheader("Connection") == "close":
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        conn.close()
        elapsed = time.monotonic() - started
        cases = sum(statuses.values())
        assert cases >= MIN_CASES

        # Every record that got through fits the store's columns.
        decode = msgspec.json.Decoder(RequestSpan)
        latest = time.time_ns() + MAX_FUTURE_NS
        for record in got:
            decode.decode(msgspec.json.encode(dict(host="h", boot_id="b", seq=1, ts_ns=record["end_ns"], **record)))
            assert 0 < record["start_ns"] <= record["end_ns"] <= min(latest, MAX_EPOCH_NS)

        # And it still serves.
        valid = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[Span(
            trace_id=b"\1" * 16, span_id=b"\2" * 8, name="after", kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=NOW_NS, end_time_unix_nano=NOW_NS + 1)])])])
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
        conn.request("POST", "/v1/traces", body=valid.SerializeToString(), headers={"Content-Type": PROTOBUF})
        assert conn.getresponse().status == 200
        conn.close()
        assert got[-1]["name"] == "after"

    assert {name: metric(name, **labels) for name, labels in [
        ("jitterscope_otlp_http_requests_total", {"code": "500"}),
        ("jitterscope_otlp_connection_errors_total", {}),
    ]} == before
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert statuses.get(200, 0) > cases // 10 and statuses.get(400, 0) > cases // 10  # it fuzzed both ways
    assert rejected > 0  # and out-of-range times did reach the span checks
    print(f"{cases} fuzz cases in {elapsed:.1f} s: answers {dict(sorted(statuses.items()))}, "
          f"{len(got) - 1} records accepted, {rejected} spans rejected (protobuf answers)")
