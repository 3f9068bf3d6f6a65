"""streams/attribution.py: matching kernel evidence to requests, in any
arrival order, and naming the dominant cause."""

from __future__ import annotations

import itertools

import pytest

from jitterscope.schemas.events import RequestSpan, RunqEvent
from jitterscope.streams.attribution import Attributor, overlap_ns

MS = 1_000_000
T0 = 1_800_000_000_000_000_000  # epoch ns
GRACE = 2_000 * MS


_SEQ = itertools.count(1)


def span(request_id: str, start_ms: float, end_ms: float, pid: int = 100, seq: int | None = None, host: str = "h1",
         name: str = "llm_request") -> RequestSpan:
    """A request span; each gets its own record key unless ``seq`` is given."""
    return RequestSpan(host=host, boot_id="b", seq=next(_SEQ) if seq is None else seq, ts_ns=T0 + int(end_ms * MS), request_id=request_id,
                       trace_id="ab" * 16, span_id="cd" * 8, name=name, pid=pid, start_ns=T0 + int(start_ms * MS),
                       end_ns=T0 + int(end_ms * MS), status="ok")


def wait(on_cpu_ms: float, wait_ms: float, pid: int = 100, suspect: tuple[int, str] = (900, "jshog"),
         host: str = "h1", seq: int = 0) -> RunqEvent:
    return RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=T0 + int(on_cpu_ms * MS), pid=pid, tid=pid + 1,
                     comm="vllm", cpu=3, wait_ns=int(wait_ms * MS), suspect_pid=suspect[0],
                     suspect_tid=suspect[0], suspect_comm=suspect[1])


def baseline(attributor: Attributor, count: int = 20, duration_ms: float = 10, host: str = "h1") -> None:
    """Teach the attributor what normal is: ``count`` quiet requests long before T0."""
    for i in range(count):
        attributor.add_request(span(f"warm-{i}", -100_000 + i * 20, -100_000 + i * 20 + duration_ms, host=host))
    assert len(attributor.due(T0)) == count


def due_after(attributor: Attributor, end_ms: float):
    return attributor.due(T0 + int(end_ms * MS) + GRACE)


def test_overlap_counts_only_the_part_inside_the_request():
    event = wait(on_cpu_ms=30, wait_ms=20)  # waited 10..30 ms
    assert overlap_ns(event, T0 + 0, T0 + 100 * MS) == 20 * MS
    assert overlap_ns(event, T0 + 20 * MS, T0 + 100 * MS) == 10 * MS
    assert overlap_ns(event, T0 + 15 * MS, T0 + 25 * MS) == 10 * MS
    assert overlap_ns(event, T0 + 30 * MS, T0 + 40 * MS) == 0


@pytest.mark.parametrize("evidence_first", [True, False])
def test_evidence_before_or_after_the_span_is_attributed_the_same(evidence_first):
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    request = span("slow-1", 0, 80)
    evidence = [wait(30, 25), wait(60, 25, suspect=(901, "backup")), wait(75, 10)]
    if evidence_first:
        for e in evidence:
            a.add_evidence(e)
        a.add_request(request)
    else:
        a.add_request(request)
        for e in evidence:
            a.add_evidence(e)
    assert a.due(T0 + 80 * MS + GRACE - 1) == [], "not before the grace period is over"
    [result] = due_after(a, 80)
    assert result.request_id == "slow-1"
    assert result.duration_ns == 80 * MS and result.baseline_ns == 10 * MS and result.excess_ns == 70 * MS
    assert result.runq_wait_ns == 60 * MS and result.runq_wait_max_ns == 25 * MS and result.runq_waits == 3
    assert result.cause == "runq_starvation" and result.explained == pytest.approx(60 / 70, abs=1e-3)
    assert [(s.comm, s.wait_ns) for s in result.suspects] == [("jshog", 35 * MS), ("backup", 25 * MS)]
    assert (result.host, result.boot_id, result.seq) == (request.host, request.boot_id, request.seq)


def test_other_processes_and_hosts_do_not_count():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 50, pid=100))
    a.add_evidence(wait(20, 15, pid=555))  # another process on the same host
    a.add_evidence(wait(20, 15, host="h2"))  # same pid number, other host
    [result] = due_after(a, 50)
    assert result.runq_wait_ns == 0 and result.suspects == []
    assert result.cause == "unexplained"


def test_unknown_process_is_attributed_at_host_level():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 50, pid=0))
    a.add_evidence(wait(20, 15, pid=555))
    [result] = due_after(a, 50)
    assert result.runq_wait_ns == 15 * MS and result.pid == 0


def test_quiet_request_has_no_cause_and_no_slo_breach():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("quiet", 0, 10))
    [result] = due_after(a, 10)
    assert result.cause == "none" and result.excess_ns == 0 and result.runq_wait_ns == 0
    assert result.slo_ns == 50 * MS and not result.slo_breached


def test_slo_is_factor_times_median_once_trusted_or_fixed():
    a = Attributor(grace_ns=GRACE, slo_factor=5, min_samples=20)
    a.add_request(span("first", 0, 500))
    [first] = due_after(a, 500)
    assert first.slo_ns == 0 and not first.slo_breached, "no judgement before 20 samples"
    baseline(a, count=20)
    a.add_request(span("slow", 0, 60))
    [slow] = due_after(a, 60)
    assert slow.slo_ns == 50 * MS and slow.slo_breached
    fixed = Attributor(grace_ns=GRACE, slo_ns=30 * MS)
    fixed.add_request(span("r", 0, 31))
    [r] = due_after(fixed, 31)
    assert r.slo_ns == 30 * MS and r.slo_breached


def test_requests_batched_together_share_the_same_wait():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("batch-a", 0, 60, seq=1))
    a.add_request(span("batch-b", 5, 65, seq=2))
    a.add_evidence(wait(40, 30))
    results = due_after(a, 65)
    assert [r.runq_wait_ns for r in results] == [30 * MS, 30 * MS]


def test_evidence_past_the_horizon_is_forgotten_and_late_evidence_counted():
    a = Attributor(grace_ns=GRACE, horizon_ns=1_000 * MS)
    a.add_evidence(wait(10, 5))
    a.add_evidence(wait(5_000, 5))  # 5 s later: the first is beyond the 1 s horizon
    a.add_request(span("r", 0, 20))
    [result] = due_after(a, 20)
    assert result.runq_wait_ns == 0
    a.add_evidence(wait(15, 5))  # arrives after "r" was attributed and overlaps it
    assert a.late_evidence == 1


def test_long_wait_that_started_before_the_request_counts():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 1_000, 1_100))
    a.add_evidence(wait(1_050, 900))  # runnable since 150 ms, got the CPU at 1050
    [result] = due_after(a, 1_100)
    assert result.runq_wait_ns == 50 * MS


def test_suspects_are_grouped_by_command_name():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 100))
    a.add_evidence(wait(20, 10, suspect=(901, "jshog")))
    a.add_evidence(wait(40, 10, suspect=(902, "jshog")))
    a.add_evidence(wait(60, 15, suspect=(902, "jshog")))
    a.add_evidence(wait(90, 20, suspect=(100, "vllm")))  # its own other thread
    [result] = due_after(a, 100)
    assert [(s.comm, s.pid, s.wait_ns) for s in result.suspects] == [("jshog", 902, 35 * MS), ("vllm", 100, 20 * MS)]


def test_request_of_an_unknown_process_gets_no_evidence():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_evidence(wait(20, 15, pid=100))
    a.add_request(span("ghost", 0, 50, pid=4_000_000))
    [result] = due_after(a, 50)
    assert result.runq_wait_ns == 0 and result.runq_waits == 0 and result.cause == "unexplained"


def test_ordinary_jitter_is_not_an_excess_to_explain():
    a = Attributor(grace_ns=GRACE)
    baseline(a, duration_ms=10)
    a.add_request(span("jitter", 0, 12))  # 2 ms over a 10 ms normal
    a.add_request(span("slow", 100, 115, seq=1))  # 5 ms over
    jitter, slow = due_after(a, 115)
    assert jitter.cause == "none" and slow.cause == "unexplained"


def ioctl(end_ms: float, latency_ms: float, pid: int = 100, host: str = "h1"):
    from jitterscope.schemas.events import GpuIoctl

    return GpuIoctl(host=host, boot_id="b", seq=0, ts_ns=T0 + int(end_ms * MS), pid=pid, tid=pid + 2,
                    comm="vllm", fd=7, request=0xC020462A, latency_ns=int(latency_ms * MS), device="/dev/nvidia0")


def test_gpu_driver_stall_is_named_when_it_explains_most():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 100))
    a.add_evidence(ioctl(90, 70))  # in the driver from 20 to 90 ms
    a.add_evidence(wait(30, 5))
    [result] = due_after(a, 100)
    assert result.cause == "gpu_ioctl_stall" and result.gpu_ioctl_ns == 70 * MS and result.gpu_ioctls == 1
    assert result.runq_wait_ns == 5 * MS
    assert result.explained == pytest.approx(70 / 90, abs=1e-3)


def test_a_redelivered_span_is_not_attributed_twice():
    attributor = Attributor(grace_ns=GRACE)
    first = span("r1", 0, 50, seq=7)
    attributor.add_request(first)
    assert [a.request_id for a in due_after(attributor, 50)] == ["r1"]
    attributor.add_request(first)  # Kafka redelivers it
    attributor.add_request(first)
    assert due_after(attributor, 50) == []


def test_a_restart_remembers_attributed_spans():
    earlier = Attributor(grace_ns=GRACE)
    earlier.add_request(span("r1", 0, 50, seq=8))
    (done,) = due_after(earlier, 50)
    restarted = Attributor(grace_ns=GRACE)
    restarted.remember(done)
    restarted.add_request(span("r1", 0, 50, seq=8))
    assert due_after(restarted, 50) == []


def test_evidence_is_bounded_by_count_in_a_storm():
    attributor = Attributor(grace_ns=GRACE, max_events_per_host=1000)
    for i in range(5000):  # all within the time horizon
        attributor.add_evidence(wait(on_cpu_ms=i, wait_ms=0.5, pid=100 + i % 7, seq=i))
    kept = sum(len(e.events) for e in attributor._evidence["h1"].values())
    assert 800 <= kept <= 1000
    assert attributor.evidence_evicted == 5000 - kept
    # the newest evidence is what stays
    attributor.add_request(span("late", 4990, 4999, pid=100 + 4995 % 7))
    (late,) = due_after(attributor, 4999)
    assert late.runq_waits >= 1


def test_pending_requests_are_bounded_by_count():
    attributor = Attributor(grace_ns=GRACE, max_pending=1000)
    for i in range(1500):
        attributor.add_request(span(f"r{i}", i, i + 1))
    early = attributor.due(T0)  # none is due by time yet
    assert [a.request_id for a in early] == [f"r{i}" for i in range(500)]
    assert attributor.pending == 1000
