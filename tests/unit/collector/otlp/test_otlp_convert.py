# SPDX-License-Identifier: Apache-2.0
"""collector/otlp/convert.py: OTLP bodies in, request records out.

Parsing: OTLP JSON's quirks (hex ids, int64 as strings, enums by number or
name) parse, and anything malformed is an OtlpError 400. Conversion: which
spans are requests (a request-ID attribute, else a root or SERVER span),
where their pid comes from, vLLM's phases, status, truncation; spans with
impossible times or ids are rejected one by one (and, over HTTP, answered as
an OTLP partial success, counted by reason) while the rest are kept."""

from __future__ import annotations

import json
import math
import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from jitterscope.collector.otlp.convert import (
    JSON, MAX_STRING_CHARS, PROTOBUF, OtlpError, parse_export_request, spans_to_requests)
from jitterscope.schemas.events import RequestSpan
from tests.fixtures.otlp_builder import (
    FIXTURES, SPAN_ID, TRACE, attrs, export, metric, post, receiver, span, with_id)  # noqa: F401 - receiver: a fixture


# -- parsing ----------------------------------------------------------------

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


def test_the_model_and_its_output_tokens_are_read_with_vllms_names_first():
    (record,), _, _ = spans_to_requests(export(span(**{
        "gen_ai__response__model": "llama-8b", "gen_ai__request__model": "asked", "gen_ai__usage__completion_tokens": 16})))
    assert (record["model"], record["output_tokens"]) == ("llama-8b", 16)
    (record,), _, _ = spans_to_requests(export(span(**{
        "gen_ai__request__model": "x" * 300, "gen_ai__usage__output_tokens": -3})))
    assert (record["model"], record.get("output_tokens")) == ("x" * 256, None)  # bounded; a negative count: none
    (record,), _, _ = spans_to_requests(export(span()))
    assert (record.get("model"), record.get("output_tokens")) == (None, None)


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
        assert (status, content_type) == (200, PROTOBUF), name
        response = ExportTraceServiceResponse.FromString(answer)
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
    assert (status, content_type) == (200, JSON)
    partial = json.loads(answer)["partialSuccess"]
    assert partial["rejectedSpans"] == "2"  # int64 is a string in OTLP JSON
    assert "1 end before start" in partial["errorMessage"] and "1 time out of range" in partial["errorMessage"]
    assert [r["name"] for r in receiver.got] == ["ok"]


def test_all_good_spans_answer_plain_success(receiver):
    status, _, answer = post(receiver.port, export(with_id("fine"), pid=1).SerializeToString())
    assert (status, answer) == (200, b"")  # no partial_success field at all


def test_long_strings_are_truncated():
    (record,), _, _ = spans_to_requests(export(with_id("i" * 10_000, name="n" * 10_000)))
    assert record["request_id"] == "i" * MAX_STRING_CHARS and record["name"] == "n" * MAX_STRING_CHARS
