# SPDX-License-Identifier: Apache-2.0
"""OTLP/HTTP trace bodies in, request records out: parsing an export
(protobuf or JSON) and turning its request spans into RequestSpan fields.

Which spans are requests, how a span's times and ids are checked and how an
invalid one is rejected alone: the package's docs (``jitterscope.collector.otlp``).
"""

from __future__ import annotations

import base64
import json
import math
import time
from typing import Callable, Iterable, NamedTuple

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client import Counter

from jitterscope.schemas.events import MAX_EPOCH_NS

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
DEFAULT_REQUEST_ID_ATTRIBUTES: tuple[str, ...] = ("gen_ai.request.id",)
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

# the model and how many tokens it wrote (gen_ai semantic conventions; vLLM's names first, then the newer ones)
MODEL_ATTRIBUTES = ("gen_ai.response.model", "gen_ai.request.model")
OUTPUT_TOKEN_ATTRIBUTES = ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")

_STATUS = {Status.STATUS_CODE_OK: "ok", Status.STATUS_CODE_ERROR: "error"}

PID_RESOLVED = Counter(
    "jitterscope_otlp_pid_resolved_total",
    "request records by how their host pid was found: process_pid (the resource's, as sent), peer (the "
    "connection's process), peer_nspid (the connection's process, whose pid in its container is process.pid), "
    "nspid (process.pid translated through NSpid in the container, pod or sender's cgroup), container (a "
    "process of the container/pod of container.id/k8s.pod.uid: the exact one was not found), unresolved "
    "(nothing matched: host level, pid 0), refused_claim (an on-host sender that is no trusted relay named a "
    "process outside its own container, pod or cgroup: charged to the sender), unverified_claim (a sender "
    "not on this host and no relay by address named a process, container or pod: ignored, host level, pid 0)",
    ["how"])


class OtlpError(Exception):
    """A request the receiver refuses: ``status_code`` is the HTTP answer."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


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
    model = _first(attributes, MODEL_ATTRIBUTES, "string_value", "")
    tokens = _first(attributes, OUTPUT_TOKEN_ATTRIBUTES, "int_value", 0)
    if model:  # only where sent, like tid: most spans are no model's
        record["model"] = model[:MAX_STRING_CHARS]
    if 0 < tokens < 2**32:
        record["output_tokens"] = tokens
    thread = attributes.get("thread.id")
    if thread is not None and thread.WhichOneof("value") == "int_value" and 0 < thread.int_value < 2**31:
        record["tid"] = thread.int_value
    return record


def _first(attributes: dict[str, AnyValue], names: tuple[str, ...], kind: str, default):
    """The value of the first of ``names`` the span carries as ``kind`` (an
    AnyValue field: "string_value", "int_value"); ``default`` for none."""
    for value in map(attributes.get, names):
        if value is not None and value.WhichOneof("value") == kind:
            return getattr(value, kind)
    return default


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
