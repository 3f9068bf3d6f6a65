# SPDX-License-Identifier: Apache-2.0
"""Per-request root cause, end to end: an OpenTelemetry-instrumented
inference-server stand-in sends its request spans to the real collector;
CPU hogs crowd its core for a while; the requests caught in that window must
be attributed to run-queue starvation with a hog as top suspect, the others
must not, and each answer is looked up in ClickHouse by request ID."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from jitterscope.streams.otlp_export import SPAN_NAME, STACK_EVENT
from jitterscope.workload import HOG_COMM, cpu_hogs, last_cpu
from tests.conftest import RunDelay, span_pipeline, wait_until
from tests.integration.test_notify import Receiver

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

STANDIN = Path(__file__).resolve().parents[2] / "examples/inference_standin.py"
MS = 1_000_000
SLO_MS = 30  # normal requests take ~10 ms; a crowded core makes them 30-80 ms


@pytest.fixture(scope="module", autouse=True)
def _own_cpu(own_cpu):
    """The requests outside the hog window are the baseline: their premise is
    a quiet CPU. The cgroup weight (tests/conftest.py) keeps outside CPU load
    from crowding the stand-in's CPU (and the pipeline's); the kernel's count
    of the stand-in's waits per request tells what still got through (see the
    test), so it is not blamed on the attribution."""
    return own_cpu


@pytest.fixture(scope="module")
def receiver():
    """The user's own OTLP endpoint (a trace backend), which gets each request's attribution span."""
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def pipeline(stack, receiver):
    # the collector takes stacks of waits of 2 ms or more (its alert level), not only of 10: behind 3 hogs
    # the stand-in waits ~3-12 ms, so the culprits' stacks are caught, not left to chance
    yield span_pipeline(stack, {"JITTERSCOPE_REQUEST_SLO_MS": str(SLO_MS),
                                "JITTERSCOPE_OTLP_EXPORT_ENDPOINT": receiver.url}, JITTERSCOPE_RUNQ_ALERT_MS="2")


def run_standin(otlp_port: int, *args: str) -> subprocess.Popen:
    """The serving thread shares the hogs' CPU; its span exporter stays off it."""
    return subprocess.Popen(
        [sys.executable, str(STANDIN), "--endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces",
         "--pin-cpu", str(last_cpu()), "--times", *args], stdout=subprocess.PIPE, text=True)


def parse(stdout: str) -> dict[str, tuple[int, int]]:
    return {rid: (int(start), int(end)) for rid, start, end in (line.split() for line in stdout.splitlines())}


def attribution(stack, request_id: str):
    rows = stack.query(
        "SELECT cause, runq_wait_ns, excess_ns, duration_ns, suspects, slo_breached, pid "
        "FROM jitterscope.request_attribution FINAL WHERE request_id = {id:String}", id=request_id)
    return rows[0] if rows else None


def test_requests_in_the_contention_window_are_blamed_on_the_hog(pipeline):
    stack, worker, collector, otlp_port = pipeline
    standin = run_standin(otlp_port, "--requests", "180", "--cpu-ms", "10", "--gap-ms", "15", "--id-prefix", "req-")
    with RunDelay(standin.pid) as kernel:  # the stand-in's waits, as the kernel counts them
        # its first request done: it has started serving (a loaded box takes seconds to start Python)
        first = standin.stdout.readline()
        time.sleep(2.5)  # requests before the hogs: the baseline
        with cpu_hogs(seconds=1.5, count=3):
            hog_start = time.time_ns()
            time.sleep(1.5)
            hog_end = time.time_ns()
        out, _ = standin.communicate(timeout=60)
    assert standin.returncode == 0
    requests = parse(first + out)
    pid = standin.pid

    inside = [r for r, (s, e) in requests.items() if s > hog_start + 50 * MS and e < hog_end - 20 * MS]
    outside = [r for r, (s, e) in requests.items() if e < hog_start - 200 * MS or s > hog_end + 500 * MS]
    assert len(inside) >= 5 and len(outside) >= 40, (len(inside), len(outside))

    last = max(requests, key=lambda r: requests[r][1])
    wait_until(lambda: attribution(stack, last), 60, "the last request attributed", worker)

    top_is_hog = 0
    breached_inside = set()
    for rid in inside:
        cause, waited, excess, duration, suspects, breached, got_pid = attribution(stack, rid)
        assert got_pid == pid
        assert cause == "runq_starvation", (rid, cause, waited, excess, duration, stack.query(
            "SELECT max(ringbuf_drops), max(map_full_drops) FROM jitterscope.collector_stats"))
        assert waited >= 0.5 * excess
        # whether the crowded core pushed a request past the SLO is the
        # scheduler's call (one took 29.5 ms on a CI box); the verdict must match it
        assert breached == (duration > SLO_MS * MS), (rid, duration, breached)
        if breached:
            breached_inside.add(rid)
        assert HOG_COMM in [x["comm"] for x in suspects], suspects
        top_is_hog += suspects[0]["comm"] == HOG_COMM
    # a kernel thread of the VM (kdamond, kworker) can out-wait the hogs for a request, not for most
    assert top_is_hog >= 0.8 * len(inside), (top_is_hog, len(inside))
    assert len(breached_inside) >= 0.8 * len(inside), (len(breached_inside), len(inside))
    assert all(attribution(stack, rid) is not None for rid in outside)
    # The baseline's premise: nothing else wanted the stand-in's CPU. Where
    # the kernel says its threads waited 1 ms or more during a request
    # (outside load the cgroup weight did not keep off), a wait is the truth,
    # not a false attribution: those requests are no baseline.
    waited = {rid: kernel.during(*requests[rid]) for rid in outside}
    baseline = [rid for rid in outside if waited[rid] is not None and waited[rid] < 1 * MS]
    if len(baseline) < 20:
        pytest.skip(f"premise not met: outside load on CPU {last_cpu()} made {len(outside) - len(baseline)} of "
                    f"{len(outside)} requests outside the hog window wait 1 ms or more (schedstat)")
    quiet = [attribution(stack, rid) for rid in baseline]
    near_zero = [q for q in quiet if q[1] < 2 * MS]
    assert len(near_zero) >= 0.9 * len(quiet), [(q[:4], waited[rid]) for rid, q in zip(baseline, quiet)
                                                 if q[1] >= 2 * MS]

    alerts = stack.query(
        "SELECT request_id, toUnixTimestamp64Nano(raised) - toUnixTimestamp64Nano(ts) FROM jitterscope.alerts "
        "WHERE kind = 'request_slo' AND pid = {pid:UInt32}", pid=pid)
    alerted = {a[0] for a in alerts}
    assert alerted & set(inside) == breached_inside
    assert not alerted & set(baseline), [(r, attribution(stack, r)) for r in sorted(alerted & set(baseline))][:5]
    # outside load may push other requests past the SLO: then the alert is right, and says so
    assert all(attribution(stack, r)[5] for r in alerted & set(outside)), sorted(alerted & set(outside))[:5]
    delays = sorted(a[1] / 1e6 for a in alerts)
    print(f"\n[measured] {len(requests)} requests, {len(inside)} in the contention window, {len(baseline)} of "
          f"{len(outside)} outside it with under 1 ms of waits (schedstat), the baseline; "
          f"attribution delay after span end: median {statistics.median(delays):.0f} ms, max {delays[-1]:.0f} ms "
          f"(grace 1000 ms)")


def test_span_without_pid_is_resolved_from_the_connection(pipeline):
    stack, worker, collector, otlp_port = pipeline
    standin = run_standin(otlp_port, "--requests", "3", "--cpu-ms", "1", "--gap-ms", "1", "--no-pid",
                          "--id-prefix", "nopid-")
    out, _ = standin.communicate(timeout=60)
    assert standin.returncode == 0 and len(parse(out)) == 3
    rows = wait_until(lambda: stack.query(
        "SELECT DISTINCT pid FROM jitterscope.requests WHERE startsWith(request_id, 'nopid-')"), 30,
        "requests of the --no-pid stand-in", worker)
    assert rows == [[standin.pid]]


def exported_spans(receiver) -> dict[str, list]:
    """The attribution spans the endpoint got, by request id: (resource's host, span, its attributes)."""
    out: dict[str, list] = {}
    for body in receiver.bodies("/v1/traces"):
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            host = {kv.key: kv.value.string_value for kv in resource.resource.attributes}["host.name"]
            for span in (span for scope in resource.scope_spans for span in scope.spans):
                attrs = {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}
                out.setdefault(attrs["jitterscope.request_id"], []).append((host, span, attrs))
    return out


def test_each_answer_reaches_the_users_trace_as_a_child_of_its_request_span(pipeline, receiver):
    """Issue 37, item 1: with otlp_export_endpoint set, every attributed
    request's answer comes back into its own trace: one child span of the
    request's span (the ids as the collector received them), carrying the
    stored cause, culprit and parts, and the culprit's stack where one was
    captured (the stored culprit_stack's frames)."""
    stack, worker, collector, otlp_port = pipeline
    standin = run_standin(otlp_port, "--requests", "120", "--cpu-ms", "5", "--gap-ms", "10", "--id-prefix", "otlp-")
    first = standin.stdout.readline()  # serving
    time.sleep(0.5)
    with cpu_hogs(seconds=1.0, count=3):  # some requests with a cause and a culprit
        time.sleep(1.0)
    out, _ = standin.communicate(timeout=60)
    assert standin.returncode == 0
    sent = set(parse(first + out))
    assert len(sent) == 120

    def stored():
        rows = stack.query(
            "SELECT a.request_id, a.cause, a.culprit, a.explained, a.host, r.trace_id, r.span_id, a.culprit_stack "
            "FROM jitterscope.request_attribution AS a FINAL JOIN jitterscope.requests AS r FINAL "
            "ON a.request_id = r.request_id AND a.host = r.host WHERE startsWith(a.request_id, 'otlp-')")
        return {row[0]: row[1:] for row in rows} if len(rows) == len(sent) else None

    rows = wait_until(stored, 90, "every request attributed", worker)
    spans = wait_until(lambda: (got := exported_spans(receiver)) and sent <= set(got) and got, 60,
                       "every attribution span at the endpoint", worker)
    assert {rid: len(spans[rid]) for rid in sent if len(spans[rid]) != 1} == {}  # one each, none twice
    stacks: dict[str, dict] = {}  # request id -> its culprit_stack event's attributes
    for rid in sent:
        cause, culprit, explained, host, trace_id, span_id, culprit_stack = rows[rid]
        (got_host, span, attrs), = spans[rid]
        assert (span.trace_id.hex(), span.parent_span_id.hex(), span.name) == (trace_id, span_id, SPAN_NAME), rid
        assert (attrs["jitterscope.cause"], attrs["jitterscope.culprit"], got_host) == (cause, culprit, host), rid
        assert abs(attrs["jitterscope.explained"] - explained) < 1e-3, rid
        assert span.span_id != span.parent_span_id and span.end_time_unix_nano > span.start_time_unix_nano
        stack_events = [e for e in span.events if e.name == STACK_EVENT]
        assert len(stack_events) <= 1 and (not stack_events or culprit_stack), rid  # only a stored stack is sent
        if stack_events:
            stacks[rid] = {kv.key: kv.value for kv in stack_events[0].attributes}
            assert stacks[rid]["jitterscope.stack.id"].string_value == f"{culprit_stack:016x}", rid
    starved = [rid for rid in sent if spans[rid][0][2]["jitterscope.cause"] == "runq_starvation"]
    assert any(HOG_COMM in spans[rid][0][2]["jitterscope.culprit"] for rid in starved), starved
    # the hogs' stacks, as the collector symbolized them: frames of the hog's own process
    hogs = [rid for rid, e in stacks.items() if e["jitterscope.stack.comm"].string_value == HOG_COMM]
    assert hogs and all(rows[rid][0] == "runq_starvation" and HOG_COMM in rows[rid][1] for rid in hogs), stacks
    assert all(stacks[rid]["jitterscope.stack.kernel"].array_value.values
               or stacks[rid]["jitterscope.stack.user"].array_value.values for rid in hogs)
    print(f"\n[measured] {len(sent)} requests, {len(sent)} attribution spans at the endpoint, each under its "
          f"request's span; {len(starved)} of them runq_starvation, {len(hogs)} with the hog's stack")
