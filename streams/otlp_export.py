# SPDX-License-Identifier: Apache-2.0
"""Each request's answer inside the user's own trace (setting
``otlp_export_endpoint``): for every attributed request whose span the
collector received with its ids, one child span of that span, same trace,
named ``jitterscope.attribution``, sent over OTLP/HTTP (protobuf) to the
user's collector (Jaeger, Tempo, an OpenTelemetry Collector). A trace viewer
then shows, under the slow ``llm_request`` span, why it was slow.

- **Attributes:** ``jitterscope.cause``, ``jitterscope.culprit``,
  ``jitterscope.explained`` (0..1), the excess and baseline, every stacked
  cause with its share, and each part of the carrying thread's time in ms
  (``jitterscope.runq_ms``, ``gil_ms``, ``memory_ms``, ``io_ms``,
  ``throttled_ms``, ``irq_ms``, ``gpu_ioctl_ms``, ``sleep_ms``,
  ``on_cpu_ms``).
- **Per phase** (vLLM's queue, prefill, decode): ``jitterscope.queue_ms`` and
  the cause that took the most of it, ``jitterscope.queue.cause``,
  ``.cause_ms`` and ``.culprit`` (streams/phases.py).
- **Events:** one ``jitterscope.wait_for`` per hop of its wait-for chain
  (streams/wait_chain.py): the thread it slept on, what kept that thread;
  and, where the probe captured it, ``jitterscope.culprit_stack``: what the
  neighbour named by a ``runq_starvation`` request ran while it held the CPU
  (``jitterscope.stack.user`` and ``.kernel`` frames, innermost first).
- **Its own span id** is derived from the request's ids, so a request
  attributed again (a restarted stage) is the same span, not a second one.

Sending is notify.Target's: a bounded queue and a thread, so the stream only
queues (never waits); a dead or slow endpoint drops what does not fit and
counts it (``jitterscope_streams_notifications_dropped_total{target="otlp"}``),
and memory stays bounded. Values are span attributes, never markup: a viewer
shows them as text.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from jitterscope.schemas.events import RequestAttribution, StackTrace
from jitterscope.streams.notify import Target

SPAN_NAME = "jitterscope.attribution"
HOP_EVENT = "jitterscope.wait_for"
STACK_EVENT = "jitterscope.culprit_stack"
BATCH_MAX = 512  # spans per POST: the OpenTelemetry SDK's batch processor's default
#: the parts of a request's time, as attribute names (``jitterscope.<name>_ms``) and the record's field
PARTS = (("throttled", "throttled_ns"), ("irq", "irq_ns"), ("gpu_ioctl", "gpu_ioctl_ns"), ("gil", "gil_wait_ns"),
         ("memory", "memory_wait_ns"), ("io", "io_wait_ns"), ("sleep", "sleep_ns"), ("on_cpu", "on_cpu_ns"))


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: as given, or with /v1/traces added to a URL
    without a path (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    return endpoint if urlsplit(endpoint).path.strip("/") else endpoint.rstrip("/") + "/v1/traces"


def exportable(a: RequestAttribution) -> bool:
    """Whether its span's ids came whole (the collector checked them; older rows have no span id)."""
    try:
        return len(bytes.fromhex(a.trace_id)) == 16 and len(bytes.fromhex(a.span_id)) == 8
    except ValueError:
        return False


def child_span_id(a: RequestAttribution) -> bytes:
    """The attribution span's id: the same request gives the same id (never all zeros, which is invalid)."""
    digest = hashlib.blake2b(f"{a.host}\0{a.trace_id}\0{a.span_id}".encode(), digest_size=8).digest()
    return digest if any(digest) else b"\0" * 7 + b"\1"


def _value(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_value(v) for v in value]))
    return AnyValue(string_value=str(value))


def _attributes(pairs: dict[str, object]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_value(value)) for key, value in pairs.items()]


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def attribution_span(a: RequestAttribution, stack: StackTrace | None = None) -> Span:
    """The child span that carries ``a``'s answer; ``stack``: the frames its culprit_stack names."""
    # the carrying thread's own run-queue wait: what its budget leaves once its stalls and CPU time are
    # counted; without a known thread, the serving group's
    blocked = a.gil_wait_ns + a.memory_wait_ns + a.io_wait_ns + a.sleep_ns + a.on_cpu_ns
    runq = max(0, a.duration_ns - blocked) if a.thread_tid else a.runq_wait_ns
    attributes = {
        "jitterscope.cause": a.cause, "jitterscope.culprit": a.culprit, "jitterscope.explained": float(a.explained),
        "jitterscope.causes": [f"{c.cause}:{c.share:g}" for c in a.causes],
        "jitterscope.excess_ms": _ms(a.excess_ns), "jitterscope.baseline_ms": _ms(a.baseline_ns),
        "jitterscope.slo_breached": a.slo_breached, "jitterscope.request_id": a.request_id,
        "jitterscope.runq_ms": _ms(runq), **{f"jitterscope.{name}_ms": _ms(getattr(a, field)) for name, field in PARTS},
        "thread.id": a.thread_tid, "process.pid": a.pid,
    }
    for p in a.phases:  # which cause took the queue, which the decode (streams/phases.py)
        prefix = f"jitterscope.{p.phase}"
        attributes.update({f"{prefix}_ms": _ms(p.ns), f"{prefix}.cause": p.cause,
                           f"{prefix}.cause_ms": _ms(p.cause_ns), f"{prefix}.culprit": p.culprit})
    hops = [Span.Event(time_unix_nano=a.end_ns, name=HOP_EVENT, attributes=_attributes({
        "jitterscope.hop": n, "thread.id": hop.tid, "jitterscope.comm": hop.comm,
        "jitterscope.waited_ms": _ms(hop.waited_ns), "jitterscope.kind": hop.kind, "jitterscope.ms": _ms(hop.ns),
        "jitterscope.culprit": hop.culprit})) for n, hop in enumerate(a.chain, 1)]
    if stack is not None:
        hops.append(Span.Event(time_unix_nano=a.end_ns, name=STACK_EVENT, attributes=_attributes({
            "jitterscope.culprit": a.culprit, "jitterscope.stack.id": f"{stack.stack_id:016x}",
            "jitterscope.stack.comm": stack.comm, "jitterscope.stack.user": stack.user,
            "jitterscope.stack.kernel": stack.kernel})))
    return Span(trace_id=bytes.fromhex(a.trace_id), span_id=child_span_id(a), parent_span_id=bytes.fromhex(a.span_id),
                name=SPAN_NAME, kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=a.start_ns,
                end_time_unix_nano=a.end_ns, attributes=_attributes(attributes), events=hops)


def export_body(batch: Iterable[tuple[RequestAttribution, StackTrace | None]]) -> bytes:
    """One ExportTraceServiceRequest (protobuf) of (attribution, its culprit's stack) pairs, a resource per host."""
    by_host: dict[str, list[Span]] = {}
    for a, stack in batch:
        by_host.setdefault(a.host, []).append(attribution_span(a, stack))
    scope = InstrumentationScope(name="jitterscope")
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=_attributes({"service.name": "jitterscope", "host.name": host})),
        scope_spans=[ScopeSpans(scope=scope, spans=spans)]) for host, spans in by_host.items()]).SerializeToString()


class AttributionExport:
    """The configured OTLP endpoint (none: every call is a no-op)."""

    def __init__(self, target: Target | None):
        self.target = target

    @classmethod
    def from_settings(cls, s) -> "AttributionExport":
        if not s.otlp_export_endpoint:
            return cls(None)
        return cls(Target("otlp", traces_url(s.otlp_export_endpoint), export_body,
                          headers={"Content-Type": "application/x-protobuf"}, queue_max=s.otlp_export_queue_max,
                          timeout_s=s.notify_timeout_s, retries=s.notify_retries, batch_max=BATCH_MAX))

    def offer(self, done: Iterable[RequestAttribution],
              stack_of: Callable[[int], StackTrace | None] = lambda _id: None) -> None:
        """Queue the exportable ones, each with the frames its culprit_stack
        names (``stack_of``: looked up here, on the stream's loop)."""
        if self.target:
            self.target.offer((a, stack_of(a.culprit_stack)) for a in done if exportable(a))

    def close(self) -> None:
        if self.target:
            self.target.close()
