# SPDX-License-Identifier: Apache-2.0
"""The attribution span sent into the user's trace (streams/otlp_export.py):
its ids, parent, attributes and hop events, decoded back with OpenTelemetry's
own proto types; and a dead endpoint that neither blocks the stream nor grows
memory."""

from __future__ import annotations

import socket
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import REGISTRY

from jitterscope.common.settings import load
from jitterscope.schemas.events import CauseShare, ChainHop, StackTrace
from jitterscope.streams import otlp_export
from tests.unit.streams.rules.test_rules import MS, attribution

SPAN_ID = "0123456789abcdef"


def decoded(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return request


def attributes(kvs) -> dict:
    out = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.values] if kind == "array_value" else value
    return out


def test_the_child_span_hangs_under_the_request_span_and_carries_the_answer():
    a = attribution(span_id=SPAN_ID, culprit="jshog (pid 4321)", thread_tid=1234, gil_wait_ns=20 * MS,
                    sleep_ns=50 * MS, on_cpu_ns=100 * MS, throttled_ns=3 * MS,
                    causes=[CauseShare(cause="runq_starvation", share=0.8), CauseShare(cause="gil_contention", share=0.1)],
                    chain=[ChainHop(tid=77, comm="EngineCore", waited_ns=41 * MS, kind="runq", ns=31 * MS,
                                    culprit="jshog")])
    (resource,) = decoded(otlp_export.export_body([(a, None)])).resource_spans
    assert attributes(resource.resource.attributes) == {"service.name": "jitterscope", "host.name": "gpu-a1"}
    (span,) = resource.scope_spans[0].spans
    assert span.trace_id == bytes.fromhex("ab" * 16) and span.parent_span_id == bytes.fromhex(SPAN_ID)
    assert span.span_id == otlp_export.child_span_id(a) and span.span_id not in (bytes(8), span.parent_span_id)
    assert span.name == "jitterscope.attribution"
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (a.start_ns, a.end_ns)
    got = attributes(span.attributes)
    assert got["jitterscope.cause"] == "runq_starvation" and got["jitterscope.culprit"] == "jshog (pid 4321)"
    assert got["jitterscope.explained"] == 0.92 and got["jitterscope.excess_ms"] == 325.0
    assert got["jitterscope.causes"] == ["runq_starvation:0.8", "gil_contention:0.1"]
    # the carrying thread's 400 ms: 20 on the GIL, 50 asleep, 100 on the CPU, the rest in the run queue
    assert (got["jitterscope.gil_ms"], got["jitterscope.sleep_ms"], got["jitterscope.on_cpu_ms"],
            got["jitterscope.runq_ms"], got["jitterscope.throttled_ms"]) == (20.0, 50.0, 100.0, 230.0, 3.0)
    assert {"jitterscope.memory_ms", "jitterscope.io_ms", "jitterscope.irq_ms", "jitterscope.gpu_ioctl_ms"} <= set(got)
    (hop,) = span.events
    assert hop.name == "jitterscope.wait_for"
    assert attributes(hop.attributes) == {
        "jitterscope.hop": 1, "thread.id": 77, "jitterscope.comm": "EngineCore", "jitterscope.waited_ms": 41.0,
        "jitterscope.kind": "runq", "jitterscope.ms": 31.0, "jitterscope.culprit": "jshog"}


def test_the_culprits_stack_is_an_event_with_its_frames_where_one_was_captured():
    a = attribution(span_id=SPAN_ID, culprit="jshog", culprit_stack=0xfeed)
    stack = StackTrace(host="gpu-a1", boot_id="b", seq=9, ts_ns=1, stack_id=0xfeed, pid=4321, comm="jshog",
                       kernel=["asm_sysvec_apic_timer_interrupt"], user=["spin", "main", "__libc_start_main"])
    export = otlp_export.AttributionExport(target=None)
    assert otlp_export.attribution_span(a).events == []  # none captured: no event
    (event,) = otlp_export.attribution_span(a, stack).events
    assert event.name == "jitterscope.culprit_stack" and event.time_unix_nano == a.end_ns
    assert attributes(event.attributes) == {
        "jitterscope.culprit": "jshog", "jitterscope.stack.id": "000000000000feed", "jitterscope.stack.comm": "jshog",
        "jitterscope.stack.user": ["spin", "main", "__libc_start_main"],
        "jitterscope.stack.kernel": ["asm_sysvec_apic_timer_interrupt"]}
    queued = []
    export.target = type("Queue", (), {"offer": lambda self, items: queued.extend(items)})()
    export.offer([a, attribution(span_id=SPAN_ID, request_id="r2")], {0xfeed: stack}.get)
    assert [(q.request_id, s) for q, s in queued] == [(a.request_id, stack), ("r2", None)]


def test_the_same_request_is_the_same_span_and_hosts_are_resources_of_their_own():
    a, b = attribution(span_id=SPAN_ID), attribution(span_id=SPAN_ID, host="gpu-b2")
    assert otlp_export.child_span_id(a) == otlp_export.child_span_id(attribution(span_id=SPAN_ID, cause="none"))
    assert otlp_export.child_span_id(a) != otlp_export.child_span_id(b)
    body = otlp_export.export_body([(a, None), (b, None), (a, None)])
    hosts = [attributes(r.resource.attributes)["host.name"] for r in decoded(body).resource_spans]
    assert hosts == ["gpu-a1", "gpu-b2"]


def test_only_requests_whose_span_ids_came_whole_are_sent():
    assert otlp_export.exportable(attribution(span_id=SPAN_ID))
    assert not otlp_export.exportable(attribution())  # a row from before span ids were kept
    assert not otlp_export.exportable(attribution(span_id="zz" * 8))
    assert not otlp_export.exportable(attribution(span_id=SPAN_ID, trace_id="ab"))


def test_the_endpoint_gets_its_traces_path_only_when_it_has_none():
    assert otlp_export.traces_url("http://otel:4318") == "http://otel:4318/v1/traces"
    assert otlp_export.traces_url("http://otel:4318/") == "http://otel:4318/v1/traces"
    assert otlp_export.traces_url("https://tempo/otlp/v1/traces") == "https://tempo/otlp/v1/traces"
    assert otlp_export.AttributionExport.from_settings(load()).target is None  # off by default


def test_a_dead_endpoint_neither_blocks_the_stream_nor_grows_memory(tmp_path):
    hung = socket.socket()  # listens, never accepts: an endpoint that hangs
    hung.bind(("127.0.0.1", 0))
    hung.listen(1)
    export = otlp_export.AttributionExport.from_settings(load(
        data_dir=tmp_path, otlp_export_endpoint=f"http://127.0.0.1:{hung.getsockname()[1]}",
        otlp_export_queue_max=50, notify_timeout_s=30, notify_retries=0))
    dropped_now = lambda: REGISTRY.get_sample_value(  # noqa: E731
        "jitterscope_streams_notifications_dropped_total", {"target": "otlp"}) or 0
    try:
        assert export.target.url.endswith("/v1/traces")
        assert export.target.headers["Content-Type"] == "application/x-protobuf"
        before = dropped_now()
        offered = [attribution(span_id=SPAN_ID, request_id=f"r{i}") for i in range(3000)]
        started = time.monotonic()
        for i in range(0, len(offered), 100):  # as the attribution tick offers them, batch by batch
            export.offer(offered[i:i + 100])
            assert export.target.queue.qsize() <= 50
        assert time.monotonic() - started < 10  # only queued: a blocking offer would wait out the 30 s timeout
        dropped = dropped_now() - before
        assert 3000 - 50 - otlp_export.BATCH_MAX <= dropped <= 3000 - 50
    finally:
        export.close()
        hung.close()
