# SPDX-License-Identifier: Apache-2.0
"""streams/attribution.py: matching kernel evidence to requests, in any
arrival order, and naming the dominant cause."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from jitterscope.schemas.events import BlockedWait, PagePlacement, RequestSpan, RunqEvent
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.evidence import overlap_ns

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
    assert result.cause == "runq_starvation" and result.causes[0].share == pytest.approx(60 / 70, abs=1e-3)
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
    a.add_evidence(wait(90, 20, suspect=(100, "vllm")))  # its own other thread: never a suspect
    [result] = due_after(a, 100)
    assert [(s.comm, s.pid, s.wait_ns) for s in result.suspects] == [("jshog", 902, 35 * MS)]
    assert (result.self_wait_ns, result.self_threads) == (20 * MS, 1)


def test_the_culprits_stack_is_the_one_it_ran_in_the_longest_wait_behind_it():
    """Stacks come only with waits worth an alert: the culprit's stack is
    its own (never another suspect's) from the longest of those."""
    from msgspec.structs import replace
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 100))
    a.add_request(span("quiet", 200, 210))
    a.add_evidence(replace(wait(30, 12, suspect=(901, "jshog")), suspect_stack=0xa))
    a.add_evidence(replace(wait(60, 25, suspect=(902, "jshog")), suspect_stack=0xb))  # the longest with a stack
    a.add_evidence(wait(99, 30, suspect=(902, "jshog")))  # longer, but no stack was taken
    a.add_evidence(replace(wait(70, 8, suspect=(903, "tar")), suspect_stack=0xc))  # longer than its share, not the culprit
    starved, quiet = due_after(a, 210)
    assert (starved.cause, starved.culprit, starved.culprit_stack) == ("runq_starvation", "jshog", 0xb)
    assert (quiet.cause, quiet.culprit_stack) == ("none", 0)


def test_the_stacks_kept_for_the_export_are_the_last_sent_and_waits_with_stacks_expire():
    from jitterscope.schemas.events import StackTrace
    from jitterscope.streams.culprits import CulpritStacks
    stacks = CulpritStacks(size=2)
    stacks.add([StackTrace(host="h1", boot_id="b", seq=i, ts_ns=T0, stack_id=i, pid=9, comm="jshog", kernel=[], user=[])
                for i in (1, 2, 3)])
    assert (stacks.get(1), stacks.get(2).stack_id, stacks.get(3).stack_id, stacks.get(0)) == (None, 2, 3, None)
    a = Attributor(grace_ns=GRACE, horizon_ns=1_000 * MS)
    from msgspec.structs import replace
    a.add_evidence(replace(wait(30, 12), suspect_stack=0xa))
    assert a.stacks.culprit_stack(span("r", 0, 100), {100}, "jshog") == 0xa
    assert a.stacks.culprit_stack(span("r", 0, 100), {101}, "jshog") == 0  # another group's wait
    a.add_evidence(wait(3_000, 1))  # the horizon moves on past it
    assert a.stacks.culprit_stack(span("r", 0, 100), {100}, "jshog") == 0
    a.add_evidence(replace(wait(3_050, 12), suspect_stack=0xb))
    a.forget_hosts({"h1"})
    assert a.stacks.culprit_stack(span("r", 3_000, 3_100), None, "jshog") == 0


def test_waits_behind_the_groups_own_threads_are_self_contention_not_a_neighbour():
    """vLLM's EngineCore with more busy threads than CPUs: the waits are the
    group's own doing, and nobody outside it is named."""
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 100))
    for i, at in enumerate((20, 45, 70, 95)):
        own = RunqEvent(**{**{f: getattr(wait(at, 20), f) for f in RunqEvent.__struct_fields__},
                           "suspect_pid": 100, "suspect_tid": 150 + i % 2, "suspect_comm": "VLLM::EngineCor"})
        a.add_evidence(own)
    a.add_evidence(wait(99, 3, suspect=(900, "jshog")))  # a neighbour, briefly
    [result] = due_after(a, 100)
    assert result.cause == "self_contention" and result.self_wait_ns == 80 * MS and result.self_threads == 2
    assert [s.comm for s in result.suspects] == ["jshog"]  # the neighbour's 3 ms, kept as evidence
    # with the same waits behind a neighbour, it is the neighbour's
    result = four_waits_behind(900, "jshog")
    assert result.cause == "runq_starvation" and result.self_wait_ns == 0 and result.suspects[0].comm == "jshog"


def four_waits_behind(suspect_pid: int, suspect_comm: str):
    """A 100 ms request that waited 4 x 20 ms with the CPU held by the suspect: its attribution."""
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_request(span("r", 0, 100))
    for at in (20, 45, 70, 95):
        a.add_evidence(wait(at, 20, suspect=(suspect_pid, suspect_comm)))
    [result] = due_after(a, 100)
    return result


def test_waits_held_by_the_idle_task_are_run_queue_time_charged_to_no_one():
    """An idle CPU waking for the thread (a VM's vCPU back from the
    hypervisor): no neighbour held it, so no suspect and no starvation,
    but the time is in the run-queue part, not on the CPU."""
    result = four_waits_behind(0, "swapper/3")
    assert (result.cause, result.suspects, result.runq_wait_ns) == ("unexplained", [], 80 * MS)


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
    assert result.causes[0].share == pytest.approx(70 / 90, abs=1e-3)
    assert result.gpu_ioctl_call == "NV_ESC_RM_CONTROL"  # 0xC020462A: _IOWR('F', 0x2A, 32)


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


# -- serving groups, throttling and interrupts ------------------------------

def process(pid: int, group: int = 0, cgroup: str = "/", host: str = "h1", **kw):
    from jitterscope.schemas.events import ProcessInfo

    return ProcessInfo(host=host, boot_id="b", seq=pid, ts_ns=T0, pid=pid, comm=f"p{pid}", cmdline="", cgroup=cgroup,
                       cpus_allowed=[3], serving_group=group, **kw)


def book(*processes):
    """The worker's host state, taught the given process records."""
    from jitterscope.streams.host_state import HostState

    state = HostState()
    for p in processes:
        state.learn(p)
    return state


def throttle(end_ms: float, interval_ms: float, throttled_ms: float, cgroup: str = "/kubepods/pod1/c1",
             quota_us: int = 50_000, period_us: int = 100_000):
    from jitterscope.schemas.events import CgroupThrottle

    return CgroupThrottle(host="h1", boot_id="b", seq=0, ts_ns=T0 + int(end_ms * MS), cgroup=cgroup,
                          interval_ns=int(interval_ms * MS), quota_us=quota_us, period_us=period_us, nr_periods=10,
                          nr_throttled=5 if throttled_ms else 0, throttled_ns=int(throttled_ms * MS))


def irq_time(end_ms: float, interval_ms: float, time_ms: float, cpu: int = 3, kind: str = "hardirq",
             source: str = "42:nvme0q3"):
    from jitterscope.schemas.events import IrqTime

    return IrqTime(host="h1", boot_id="b", seq=0, ts_ns=T0 + int(end_ms * MS), cpu=cpu, interval_ns=int(interval_ms * MS),
                   kind=kind, source=source, count=100, time_ns=int(time_ms * MS))


def engine_wait(on_cpu_ms: float, wait_ms: float, pid: int = 200, tid: int = 201, suspect=(900, "jshog"), cpu: int = 3):
    return RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + int(on_cpu_ms * MS), pid=pid, tid=tid,
                     comm="VLLM::EngineCor", cpu=cpu, wait_ns=int(wait_ms * MS), suspect_pid=suspect[0],
                     suspect_tid=suspect[0], suspect_comm=suspect[1])


def test_the_serving_group_s_waits_count_and_are_named():
    # pid 100 sends the spans; 200 (its engine) is in its group; 300 is a neighbour process
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100),
                                                  process(300, group=0)))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(engine_wait(60, 50))
    a.add_evidence(wait(80, 10, pid=100))
    a.add_evidence(engine_wait(80, 20, pid=300, tid=301))
    [result] = due_after(a, 100)
    assert result.runq_wait_ns == 60 * MS and result.runq_waits == 2
    assert result.pids == [100, 200] and result.cause == "runq_starvation"
    assert result.suspects[0].comm == "jshog"


def test_without_a_group_only_the_span_process_counts():
    a = Attributor(grace_ns=GRACE, processes=book(process(100), process(200)))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(engine_wait(40, 30))
    [result] = due_after(a, 100)
    assert result.runq_wait_ns == 0 and result.pids == [] and result.cause == "unexplained"


def test_a_process_that_leaves_the_group_stops_counting():
    state = book(process(100, group=100), process(200, group=100))
    state.learn(process(200, group=0))  # re-described after it left the tree
    assert state.serving_group("h1", 100) == {100}


def test_a_thread_s_time_is_counted_once():
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(engine_wait(40, 30))
    a.add_evidence(engine_wait(40, 30))  # redelivered
    a.add_evidence(engine_wait(45, 20))  # overlaps the same thread's wait: a duplicate by another route
    a.add_evidence(engine_wait(40, 30, tid=202))  # another thread, same time: counts
    [result] = due_after(a, 100)
    assert result.runq_wait_ns == (30 + 5 + 30) * MS
    assert result.suspects[0].wait_ns == 65 * MS


def test_throttled_cgroup_is_the_cause_and_named():
    a = Attributor(grace_ns=GRACE, processes=book(
        process(100, group=100, cgroup="/kubepods/pod1/c1", pod="vllm-0", namespace="serving", container="vllm"),
        process(200, group=100, cgroup="/kubepods/pod1/c1")))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(engine_wait(90, 80, suspect=(900, "kworker/3:1")))  # waited 10..90 ms
    # throttled 80% of the interval that covers the request: 64 of the 80 ms
    a.add_evidence(throttle(end_ms=500, interval_ms=1000, throttled_ms=800))
    [result] = due_after(a, 100)
    assert result.throttled_ns == 64 * MS and result.irq_ns == 0
    assert result.cause == "cfs_throttling" and result.causes[0].share == pytest.approx(64 / 90, abs=1e-3)
    assert result.suspects[0].wait_ns == 16 * MS, "only the unthrottled rest is the neighbour's"
    assert (result.pod, result.namespace, result.container) == ("vllm-0", "serving", "vllm")
    culprits = a.culprits(result)
    assert culprits.throttle.cgroup == "/kubepods/pod1/c1" and culprits.throttle.quota_us == 50_000


def test_a_pod_level_limit_throttles_its_containers_and_an_idle_cpu_means_throttled():
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, cgroup="/kubepods/pod1/c1")))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    # nothing else ran on the CPU while it waited (suspect: the idle task)
    a.add_evidence(wait(90, 80, pid=100, suspect=(0, "swapper/3")))
    a.add_evidence(throttle(end_ms=500, interval_ms=1000, throttled_ms=100, cgroup="/kubepods/pod1"))
    [result] = due_after(a, 100)
    assert result.throttled_ns == 80 * MS and result.cause == "cfs_throttling"
    assert a.culprits(result).throttle.cgroup == "/kubepods/pod1"


def test_an_idle_cpu_wait_is_charged_to_the_throttling_counted_after_the_interval_it_began_in():
    """cpu.stat counts a throttled stretch when it ends: a wait from 40 to
    90 ms, across a sampler boundary at 80 ms, shows only in the record of
    (80, 330]. The CPU sat idle, so all of it is the quota's."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, cgroup="/kubepods/pod1/c1")))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(wait(90, 50, pid=100, suspect=(0, "swapper/3")))
    a.add_evidence(throttle(end_ms=330, interval_ms=250, throttled_ms=60))
    [result] = due_after(a, 330)
    assert result.throttled_ns == 50 * MS and result.cause == "cfs_throttling"


def test_throttling_of_another_cgroup_or_time_is_not_charged():
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, cgroup="/kubepods/pod1/c1")))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(wait(90, 80, pid=100))
    a.add_evidence(throttle(end_ms=500, interval_ms=1000, throttled_ms=800, cgroup="/kubepods/pod2/c1"))
    a.add_evidence(throttle(end_ms=-1000, interval_ms=1000, throttled_ms=800))  # before the wait
    a.add_evidence(throttle(end_ms=1500, interval_ms=1000, throttled_ms=0))  # unthrottled: not even kept
    [result] = due_after(a, 100)
    assert result.throttled_ns == 0 and result.cause == "runq_starvation"
    assert a.culprits(result).throttle is None
    kept = [r.ts_ns for (key, _), e in a._evidence["h1"].items() if key == "/kubepods/pod1/c1" for r in e.events]
    assert kept == [T0 - 1000 * MS], "an unthrottled interval is not kept"


def test_interrupts_on_the_wait_s_cpu_are_the_cause():
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(engine_wait(90, 80, suspect=(900, "jshog"), cpu=3))  # waited 10..90 ms on CPU 3
    # CPU 3 spent 70% of a 200 ms interval in one IRQ and 5% in NET_RX softirq
    a.add_evidence(irq_time(end_ms=150, interval_ms=200, time_ms=140, cpu=3))
    a.add_evidence(irq_time(end_ms=150, interval_ms=200, time_ms=10, cpu=3, kind="softirq", source="NET_RX"))
    a.add_evidence(irq_time(end_ms=150, interval_ms=200, time_ms=190, cpu=2))  # another CPU: not its wait's
    [result] = due_after(a, 100)
    assert result.irq_ns == 60 * MS  # 80 ms x (70% + 5%)
    assert result.cause == "irq" and result.throttled_ns == 0
    culprits = a.culprits(result)
    assert (culprits.irq.cpu, culprits.irq.source) == (3, "42:nvme0q3")


def test_a_vcpu_the_hypervisor_took_is_steal_never_a_neighbour_s():
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(engine_wait(90, 80, suspect=(900, "jshog"), cpu=3))  # waited 10..90 ms on CPU 3
    # the hypervisor ran another guest on vCPU 3 for 75% of a 200 ms interval, an IRQ for 10%
    a.add_evidence(irq_time(end_ms=150, interval_ms=200, time_ms=150, cpu=3, kind="steal", source="hypervisor"))
    a.add_evidence(irq_time(end_ms=150, interval_ms=200, time_ms=20, cpu=3))
    [result] = due_after(a, 100)
    assert (result.cause, result.culprit) == ("steal", "hypervisor")
    assert result.irq_ns == 68 * MS and result.suspects[0].wait_ns == 12 * MS, "the neighbour: only what is left"
    assert [(c.cause, round(c.share * 90)) for c in result.causes] == [("steal", 60), ("runq_starvation", 12),
                                                                        ("irq", 8)]


def test_interrupt_time_is_capped_by_the_wait():
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100)))
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    a.add_evidence(wait(90, 80, pid=100))
    a.add_evidence(irq_time(end_ms=100, interval_ms=100, time_ms=300))  # summed over sources beyond the wall
    [result] = due_after(a, 100)
    assert result.irq_ns == 80 * MS and result.cause == "irq" and result.suspects == []


def test_unloaded_host_gets_no_cause_from_throttle_or_irq_records():
    """Interrupts and throttling that happened while the request's threads
    did not wait explain nothing: no false cause on quiet requests."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, cgroup="/kubepods/pod1/c1")))
    baseline(a)
    a.add_request(span("quiet", 0, 10, pid=100))
    a.add_request(span("slow", 100, 150, pid=100))  # slow for reasons the kernel did not see
    a.add_evidence(throttle(end_ms=500, interval_ms=1000, throttled_ms=900))
    a.add_evidence(irq_time(end_ms=500, interval_ms=1000, time_ms=500))
    quiet, slow = due_after(a, 150)
    assert quiet.cause == "none" and slow.cause == "unexplained"
    assert quiet.throttled_ns == slow.throttled_ns == quiet.irq_ns == slow.irq_ns == 0
    assert a.culprits(slow).throttle is None and a.culprits(slow).irq is None


def test_throttle_and_irq_evidence_are_bounded_by_count():
    a = Attributor(grace_ns=GRACE, max_events_per_host=1000)
    for i in range(3000):
        a.add_evidence(irq_time(end_ms=i, interval_ms=1, time_ms=0.1, cpu=i % 4))
        a.add_evidence(throttle(end_ms=i, interval_ms=1, throttled_ms=0.5))
    kept = sum(len(e.events) for e in a._evidence["h1"].values())
    assert 800 <= kept <= 1000 and a.evidence_evicted == 6000 - kept


def test_the_worker_hands_throttle_and_irq_records_to_the_attributor():
    import asyncio

    from jitterscope.schemas import topics
    from jitterscope.streams.handlers import Handlers

    state = book(process(100, group=100, cgroup="/kubepods/pod1/c1"))
    a = Attributor(grace_ns=GRACE, processes=state)
    handlers = Handlers(state, attributor=a)
    baseline(a)
    a.add_request(span("r", 0, 100, pid=100))
    asyncio.run(handlers.handle(topics.RUNQ, [wait(90, 80, pid=100)], T0))
    asyncio.run(handlers.handle(topics.CGROUP_THROTTLE, [throttle(end_ms=500, interval_ms=1000, throttled_ms=500)], T0))
    asyncio.run(handlers.handle(topics.IRQ, [irq_time(end_ms=500, interval_ms=1000, time_ms=250)], T0))
    [result] = due_after(a, 100)
    assert result.throttled_ns == 40 * MS and result.irq_ns == 20 * MS  # 50% and 25% of the 80 ms wait


def test_a_baseline_learned_during_contention_does_not_make_it_normal():
    """The README's demo: every request of the stand-in waits behind the
    hogs. Learning plain durations made ~50 ms "normal", and a 54 ms request
    with 43 ms behind jshog got cause none."""
    a = Attributor(grace_ns=GRACE)
    for i in range(30):  # 11 ms of work, 40 ms behind the hog, one every 100 ms
        a.add_request(span(f"r{i}", i * 100, i * 100 + 51))
        a.add_evidence(wait(i * 100 + 45, 40, seq=i))
    learned = due_after(a, 30 * 100)
    assert len(learned) == 30 and all(r.service_ns == 11 * MS for r in learned)
    assert a.baseline_ns("h1", "llm_request") == (11 * MS, True, 0)  # the same work each time: no spread
    a.add_request(span("req-502", 5_000, 5_054))
    a.add_evidence(wait(5_050, 43))
    [result] = due_after(a, 5_054)
    assert result.baseline_ns == 11 * MS and result.excess_ns == 43 * MS
    assert result.cause == "runq_starvation" and result.suspects[0].comm == "jshog"
    assert result.slo_breached is False  # 54 ms < 5 x 11 ms: slow, explained, within the objective


def test_an_excess_within_the_usual_spread_is_none_unless_over_the_slo():
    """A noisy server's requests take 10 to 29 ms of work (median 19.5,
    the 90th percentile 28): one at 27 ms, 5 ms of it behind a hog, is
    within its usual spread, cause none; the same over an SLO of 25 ms
    gets its parts; one far over the spread is named."""
    for slo_ms, within in ((0, "none"), (25, "runq_starvation")):
        a = Attributor(grace_ns=GRACE, slo_ns=slo_ms * MS)
        for i in range(40):
            a.add_request(span(f"r{i}", i * 100, i * 100 + 10 + i % 20))
        due_after(a, 40 * 100)
        assert a.baseline_ns("h1", "llm_request") == (19.5 * MS, True, 8.5 * MS)
        a.add_request(span("noisy", 5_000, 5_027))
        a.add_evidence(wait(5_020, 5))
        a.add_request(span("slow", 6_000, 6_060))
        a.add_evidence(wait(6_050, 38, seq=1))
        noisy, slow = sorted(due_after(a, 6_060), key=lambda r: r.start_ns)
        assert (noisy.excess_ns, noisy.cause) == (7.5 * MS, within)
        assert slow.cause == "runq_starvation"


def test_a_request_slowed_by_half_its_baseline_is_a_finding_however_wide_the_spread():
    """Slow requests whose waits were not seen leave long service times in
    the window: a spread that wide must not hide a request 1.6x its median."""
    a = Attributor(grace_ns=GRACE)
    for i in range(40):  # 20 ms of work, one in four 300 ms (waits not seen)
        a.add_request(span(f"r{i}", i * 400, i * 400 + (300 if i % 4 == 0 else 20)))
    due_after(a, 40 * 400)
    median, _trusted, spread = a.baseline_ns("h1", "llm_request")
    assert spread > median
    a.add_request(span("slowed", 20_000, 20_000 + 1.6 * median / MS))
    a.add_evidence(wait(20_000 + 1.5 * median / MS, 0.55 * median / MS))
    [slowed] = due_after(a, 21_000)
    assert slowed.cause == "runq_starvation"


def own_wait(on_cpu_ms: float, wait_ms: float, seq: int = 0) -> RunqEvent:
    """A wait of the serving thread behind its own group's engine thread."""
    return msgspec.structs.replace(wait(on_cpu_ms, wait_ms, seq=seq), suspect_pid=100, suspect_tid=150,
                                   suspect_comm="VLLM::EngineCor")


def test_routine_waits_behind_its_own_threads_are_learned_as_normal_and_only_more_is_named():
    """A real vLLM on 2 CPUs: every request's front end waits ~20 ms behind
    its engine's threads. That is how the service runs, so the baseline keeps
    it, and a quiet request is not named self_contention; one that waited
    far longer behind them is."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100)))
    for i in range(30):  # 60 ms of work, 20 ms of it behind its own engine, one every 100 ms
        a.add_request(span(f"r{i}", i * 100, i * 100 + 80))
        a.add_evidence(own_wait(i * 100 + 70, 20, seq=i))
    learned = due_after(a, 30 * 100)
    assert all(r.service_ns == 80 * MS and r.self_wait_ns == 20 * MS for r in learned)
    a.add_request(span("quiet", 5_000, 5_090))  # 90 ms: 25 ms behind its engine
    a.add_evidence(own_wait(5_080, 25, seq=100))
    a.add_request(span("batched", 6_000, 6_160))  # 160 ms: 100 ms behind its engine
    a.add_evidence(own_wait(6_150, 100, seq=101))
    quiet, batched = sorted(due_after(a, 6_160), key=lambda r: r.start_ns)
    assert (quiet.baseline_ns, quiet.excess_ns, quiet.cause) == (80 * MS, 10 * MS, "none")
    assert batched.cause == "self_contention" and batched.excess_ns == 80 * MS and batched.self_wait_ns == 100 * MS


def test_priming_learns_the_stored_service_time():
    a = Attributor(grace_ns=GRACE)
    a.add_request(span("r", 0, 50))
    a.add_evidence(wait(45, 40))
    [done] = due_after(a, 50)
    b = Attributor(grace_ns=GRACE)
    b.remember(done)
    assert b.baseline_ns("h1", "llm_request") == (10 * MS, False, 0)


def blocked(end_ms: float, blocked_ms: float, kind: str = "gil", pid: int = 100, tid: int = 101,
            waker: tuple[int, int, str] = (100, 177, "gil-hog"), device: str = "") -> BlockedWait:
    return BlockedWait(host="h1", boot_id="b", seq=0, ts_ns=T0 + int(end_ms * MS), pid=pid, tid=tid, comm="vllm",
                       kind=kind, blocked_ns=int(blocked_ms * MS), waker_pid=waker[0], waker_tid=waker[1],
                       waker_comm=waker[2], device=device)


def test_gil_wait_is_the_cause_with_its_holder_and_the_budget_adds_up():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    # 40 ms: 20 of them waiting for the GIL (the holder woke it each time), 3 asleep, 2 behind a neighbour
    for end in (10, 20, 30, 40):
        a.add_evidence(blocked(end, 5))
    a.add_evidence(blocked(33, 3, kind="sleep", waker=(0, 0, "swapper/1")))
    a.add_evidence(blocked(20, 5, waker=(100, 177, "gil-hog")))  # the same wait again (redelivered): counted once
    a.add_evidence(wait(on_cpu_ms=3, wait_ms=2))
    a.add_request(span("gil-1", 0, 40))
    [r] = due_after(a, 40)
    assert r.cause == "gil_contention" and r.culprit == "gil-hog[177]"
    assert r.causes[0].share == pytest.approx(20 / 30, abs=1e-3)
    assert (r.thread_tid, r.gil_wait_ns, r.sleep_ns, r.runq_wait_ns) == (101, 20 * MS, 3 * MS, 2 * MS)
    assert r.on_cpu_ns == 40 * MS - 20 * MS - 3 * MS - 2 * MS
    # what the baseline learns is the request less the thread's waits and stalls
    assert r.service_ns == 18 * MS


def test_sleep_is_budgeted_but_never_a_cause_and_io_and_memory_are():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_evidence(blocked(30, 25, kind="sleep", waker=(300, 301, "tokenizer")))
    a.add_evidence(blocked(80, 25, kind="io", tid=102, waker=(0, 0, "swapper/0")))
    a.add_evidence(blocked(130, 30, kind="memory", tid=103, waker=(0, 0, "swapper/0")))
    for rid, start, end in (("asleep", 0, 40), ("disk", 50, 90), ("faults", 100, 140)):
        a.add_request(span(rid, start, end))
    got = {r.request_id: r for r in due_after(a, 140)}
    assert got["asleep"].cause == "unexplained" and got["asleep"].sleep_ns == 25 * MS
    # no device known (a collector before BlockedWait.device): no culprit, not whatever ran where it completed
    assert (got["disk"].cause, got["disk"].culprit, got["disk"].io_wait_ns) == ("io_wait", "", 25 * MS)
    assert (got["faults"].cause, got["faults"].memory_wait_ns, got["faults"].thread_tid) == (
        "memory_stall", 30 * MS, 103)


def test_an_io_wait_names_the_device_the_carrying_thread_waited_on_longest():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_evidence(blocked(70, 8, kind="io", waker=(22, 22, "ksoftirqd/1"), device="nvme0n1"))
    a.add_evidence(blocked(85, 15, kind="io", waker=(0, 0, "swapper/1"), device="loop0"))
    a.add_evidence(blocked(88, 30, kind="io", tid=150, device="sdb"))  # another thread's, longer: not its path
    request = span("disk", 50, 90)
    a.add_request(RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101}))
    [r] = due_after(a, 90)
    assert (r.cause, r.culprit, r.io_wait_ns) == ("io_wait", "loop0", 23 * MS)


def test_the_span_s_thread_is_the_one_whose_budget_counts():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    # the hog thread (177) waits for the GIL as long as the server (101) does; the span names the server
    for end in (10, 20, 30, 40):
        a.add_evidence(blocked(end, 5, tid=101, waker=(100, 177, "gil-hog")))
        a.add_evidence(blocked(end - 5, 5, tid=177, waker=(100, 101, "vllm")))
    # a neighbour's wait of another thread of the group: not on the server's path
    a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 38 * MS, pid=100, tid=300, comm="logger",
                             cpu=1, wait_ns=30 * MS, suspect_pid=900, suspect_tid=900, suspect_comm="jshog"))
    request = span("gil-2", 0, 40)
    named = RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101})
    a.add_request(named)
    [r] = due_after(a, 40)
    assert (r.cause, r.culprit, r.thread_tid, r.runq_wait_ns) == ("gil_contention", "gil-hog[177]", 101, 0)
    # unnamed, the most delayed thread carries it, and the group's waits count: the logger's
    a.add_request(span("gil-3", 0, 40))
    [r] = due_after(a, 40)
    assert (r.cause, r.thread_tid, r.runq_wait_ns) == ("runq_starvation", 300, 30 * MS)


def test_a_gil_wait_woken_by_its_timeout_names_the_thread_that_took_the_gil():
    """The holder's drop can beat the waiter back to sleep: its signal wakes
    no one, the waiter's wait ends by its 5 ms timeout (the timer woke it, on
    an idle CPU: pid 0) and it takes the GIL without waiting again. The
    holder is the thread that took the GIL from it, its own GIL wait woken
    by the waiter, just before."""
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_evidence(blocked(4.9, 5, tid=177, waker=(100, 101, "vllm")))  # the hog took the GIL from the server at 4.9
    a.add_evidence(blocked(10, 5, tid=101, waker=(0, 0, "swapper/1")))  # the server waited 5-10, woken by its timer
    a.add_evidence(blocked(-20, 5, tid=178, waker=(100, 101, "vllm")))  # a hand-off long before: not this wait's
    request = span("gil-5", 0, 15)
    a.add_request(RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101}))
    [r] = due_after(a, 15)
    assert (r.cause, r.culprit, r.gil_wait_ns) == ("gil_contention", "vllm[177]", 5 * MS)
    # no hand-off recorded near it (the taker did not wait long enough to be seen): the timer stays
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_evidence(blocked(-20, 5, tid=178, waker=(100, 101, "vllm")))
    a.add_evidence(blocked(10, 5, tid=101, waker=(0, 0, "swapper/1")))
    a.add_request(RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101}))
    [r] = due_after(a, 15)
    assert (r.cause, r.culprit) == ("gil_contention", "interrupt")


def test_a_gil_holder_kept_off_the_cpu_is_the_cause_behind_the_gil_wait():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    # the server waited 30 ms for the GIL; its holder (177) spent 25 of them behind a neighbour, and 5 more
    # after the server's last GIL wait (not the server's delay)
    for end in (10, 20, 30):
        a.add_evidence(blocked(end, 10, tid=101, waker=(100, 177, "exporter")))
    a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 35 * MS, pid=100, tid=177, comm="exporter",
                             cpu=0, wait_ns=30 * MS, suspect_pid=900, suspect_tid=900, suspect_comm="jshog"))
    request = span("gil-4", 0, 40)
    a.add_request(RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101}))
    [r] = due_after(a, 40)
    assert (r.cause, r.runq_wait_ns, r.gil_wait_ns) == ("gil_contention", 25 * MS, 30 * MS)
    # behind a quota instead: the limit is the cause, not the lock
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, cgroup="/limited")))
    baseline(a)
    for end in (10, 20, 30):
        a.add_evidence(blocked(end, 10, tid=101, waker=(100, 177, "exporter")))
    a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 30 * MS, pid=100, tid=177, comm="exporter",
                             cpu=0, wait_ns=30 * MS, suspect_pid=0, suspect_tid=0, suspect_comm="swapper/0"))
    a.add_evidence(throttle(40, 100, 60, cgroup="/limited"))
    a.add_request(RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101}))
    [r] = due_after(a, 40)
    assert (r.cause, r.throttled_ns, r.gil_wait_ns) == ("cfs_throttling", 30 * MS, 30 * MS)


def test_a_gil_hog_that_also_holds_the_cpu_is_one_cause_not_two_halves():
    """A thread that holds the GIL and a CPU delays the front end both
    ways: 30 ms waiting for its GIL, 30 ms in the run queue behind it (and
    10 behind the engine). The run queue alone was half the 80 ms excess,
    self-contention; but the hog did most of both, so the lock it holds is
    the cause, and it is the culprit. Behind the engine, the same waits
    stay self-contention."""
    def request(behind: tuple[int, int, str]):
        a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))
        baseline(a)
        for end in (10, 30, 50):
            a.add_evidence(blocked(end, 10, tid=101, waker=(100, 177, "gil-hog")))
        for end in (20, 40, 60):
            a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + end * MS, pid=100, tid=101,
                                     comm="vllm", cpu=0, wait_ns=10 * MS, suspect_pid=behind[0],
                                     suspect_tid=behind[1], suspect_comm=behind[2]))
        a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 80 * MS, pid=100, tid=101, comm="vllm",
                                 cpu=0, wait_ns=10 * MS, suspect_pid=200, suspect_tid=201, suspect_comm="engine"))
        named = span("gil-7", 0, 90)
        a.add_request(RequestSpan(**{**{f: getattr(named, f) for f in named.__struct_fields__}, "tid": 101}))
        [r] = due_after(a, 90)
        return r

    r = request((100, 177, "gil-hog"))
    assert (r.cause, r.culprit, r.gil_wait_ns, r.self_wait_ns) == ("gil_contention", "gil-hog[177]", 30 * MS, 40 * MS)
    assert r.causes[0].share == pytest.approx(60 / 80, abs=1e-3)
    r = request((200, 202, "engine"))
    assert (r.cause, r.self_wait_ns, r.causes[0].share) == ("self_contention", 40 * MS, 0.5)


def test_a_request_no_thread_carried_is_named_self_contention_only_for_more_than_usual():
    """vLLM's front end sleeps through a request while its engine works,
    and the engine waits behind the front end on every request on 2 CPUs
    (here 20 ms). A quiet request 30 ms over the median is not named for
    that routine; one whose engine waited 50 ms is, for the 30 ms more."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))

    def request(rid: str, start_ms: float, duration_ms: float, engine_wait_ms: float) -> None:
        a.add_request(span(rid, start_ms, start_ms + duration_ms, pid=100))
        a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + int((start_ms + 60) * MS), pid=200,
                                 tid=201, comm="engine", cpu=1, wait_ns=int(engine_wait_ms * MS), suspect_pid=100,
                                 suspect_tid=101, suspect_comm="vllm"))

    for i in range(20):
        request(f"warm-{i}", -100_000 + i * 200, 100, 20)
    assert {r.cause for r in a.due(T0)} == {"none"}
    request("routine", 0, 130, 20)
    request("more", 200, 130, 50)
    got = {r.request_id: r for r in due_after(a, 330)}
    assert (got["routine"].cause, got["routine"].excess_ns, got["routine"].self_wait_ns) == (
        "unexplained", 30 * MS, 20 * MS)
    assert (got["more"].cause, got["more"].causes[0].share) == ("self_contention", 1.0)


def test_group_threads_queued_together_weigh_once_beside_the_front_end_s_gil_wait():
    """A model's 8 worker threads queued behind each other for the same
    10 ms are 10 ms of the request's delay, not 80, beside the 30 ms its
    front end waited for the GIL (a real vLLM on 2 CPUs: its engine's
    threads always queue a little)."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100), process(200, group=100)))
    baseline(a)
    for tid in range(201, 209):  # the engine's threads, each behind another of them
        a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 30 * MS, pid=200, tid=tid, comm="engine",
                                 cpu=tid % 2, wait_ns=10 * MS, suspect_pid=200, suspect_tid=tid + 1,
                                 suspect_comm="engine"))
    a.add_evidence(blocked(35, 30, tid=101, waker=(100, 177, "gil-hog")))
    a.add_request(span("gil-6", 0, 45))
    [r] = due_after(a, 45)
    assert (r.cause, r.culprit, r.gil_wait_ns) == ("gil_contention", "gil-hog[177]", 30 * MS)
    assert r.runq_wait_ns == 80 * MS and r.self_wait_ns == 80 * MS  # the stored sums stay sums


def test_a_named_thread_that_mostly_waited_on_its_group_leaves_the_group_s_evidence_in():
    """vLLM's front end names itself (thread.id) but, under a CPU limit,
    spends the request asleep while its throttled engine works: its own
    3 ms in the run queue do not explain the request; the engine's 30 ms
    throttled do."""
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, cgroup="/limited"),
                                                  process(200, group=100, cgroup="/limited")))
    baseline(a)
    a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 40 * MS, pid=100, tid=101, comm="vllm",
                             cpu=0, wait_ns=3 * MS, suspect_pid=0, suspect_tid=0, suspect_comm="swapper/0"))
    a.add_evidence(RunqEvent(host="h1", boot_id="b", seq=0, ts_ns=T0 + 35 * MS, pid=200, tid=201, comm="engine",
                             cpu=1, wait_ns=30 * MS, suspect_pid=0, suspect_tid=0, suspect_comm="swapper/1"))
    a.add_evidence(throttle(45, 100, 60, cgroup="/limited"))
    request = span("limit-1", 0, 45)
    a.add_request(RequestSpan(**{**{f: getattr(request, f) for f in request.__struct_fields__}, "tid": 101}))
    [r] = due_after(a, 45)
    assert (r.cause, r.thread_tid, r.throttled_ns) == ("cfs_throttling", 101, 33 * MS)


def placement(end_ms: float, pid: int, comm: str, cache: int = 0, alloc: int = 0,
              memory_cgroup: str = "", node: int = 0, exited: bool = False) -> PagePlacement:
    return PagePlacement(host="h1", boot_id="b", seq=0, ts_ns=T0 + int(end_ms * MS), pid=pid, comm=comm, node=node,
                         interval_ns=1_000 * MS, page_cache_pages=cache, alloc_pages=alloc,
                         memory_cgroup=memory_cgroup, exited=exited)


def test_a_memory_stall_names_who_filled_memory_before_it_not_the_group_itself():
    a = Attributor(grace_ns=GRACE)
    baseline(a)
    a.add_evidence(placement(-30_000, 700, "log-archiver", alloc=9_000))  # buffered its logs 30 s before
    a.add_evidence(placement(-120_000, 800, "old-backup", cache=90_000))  # long before: not this stall's
    a.add_evidence(placement(-5_000, 701, "sshd", alloc=300))
    a.add_evidence(placement(40, 100, "vllm", cache=20_000))  # the server faulting its weights back itself
    a.add_evidence(blocked(40, 30, kind="memory", waker=(0, 0, "swapper/0")))
    a.add_request(span("mem-1", 0, 40))
    [r] = due_after(a, 40)
    assert (r.cause, r.culprit, r.memory_wait_ns) == ("memory_stall", "log-archiver (pid 700)", 30 * MS)


def stalled_on_memory(*placements, processes=None, due_ms: int = 40):
    """The attribution of a request (0-40 ms) whose thread stalled 30 ms on memory, with ``placements`` known."""
    a = Attributor(grace_ns=GRACE, **({"processes": processes} if processes else {}))
    baseline(a)
    for record in placements:
        a.add_evidence(record)
    a.add_evidence(blocked(40, 30, kind="memory", waker=(0, 0, "swapper/0")))
    a.add_request(span("mem", 0, 40))
    [r] = due_after(a, due_ms)
    return r


def test_an_evictor_that_exited_before_the_stall_holds_none_of_its_allocations():
    # an archiver run by cron: the run of 30 s ago allocated more, and exited (its memory freed); this
    # run, another pid, holds what it allocated now. A reader that exited keeps its page cache counted.
    r = stalled_on_memory(placement(-30_000, 700, "archiver", alloc=9_000),
                          placement(-27_000, 700, "archiver", exited=True),
                          placement(-2_000, 710, "archiver", alloc=7_000))
    assert (r.cause, r.culprit) == ("memory_stall", "archiver (pid 710)")

    r = stalled_on_memory(placement(-30_000, 700, "archiver", alloc=9_000, cache=8_000),
                          placement(-27_000, 700, "archiver", exited=True),
                          placement(-2_000, 710, "archiver", alloc=7_000))
    assert r.culprit == "archiver (pid 700)", "its 8,000 pages of page cache stay after it exits"

    # its exit came after the request began: it held its memory through the stall
    r = stalled_on_memory(placement(-30_000, 700, "archiver", alloc=9_000),
                          placement(20, 700, "archiver", exited=True),
                          placement(-2_000, 710, "archiver", alloc=7_000))
    assert r.culprit == "archiver (pid 700)"


def test_the_evictor_is_named_by_its_newest_name():
    # counted first while still an interpreter (before its prctl): named as it calls itself since
    r = stalled_on_memory(placement(-500, 710, "python", alloc=7_000), placement(500, 710, "archiver", alloc=300),
                          due_ms=600)
    assert (r.cause, r.culprit) == ("memory_stall", "archiver (pid 710)")


def test_under_a_limit_no_one_charged_elsewhere_is_named_the_evictor():
    # the stall came before the archiver's page counts did (they come every interval): the broker that
    # wrote the most page cache on the host is charged to another memory cgroup, so it is not named
    r = stalled_on_memory(placement(-3_000, 900, "tansu", cache=500_000, memory_cgroup="/system.slice/broker"),
                          processes=book(process(100, group=100, memory_cgroup="/serving")))
    assert r.cause == "memory_stall" and "tansu" not in r.culprit, r.culprit  # the stall's waker stands in


def test_with_no_memory_limit_the_evictor_is_who_filled_the_serving_group_s_own_node():
    # two nodes, no limit: a node's reclaim takes from that node, so the backup that filled node 1
    # (the most pages on the host) did not evict the server's weights on node 0; the archiver did.
    # With none of the group's pages seen, every node counts, as on a one-node host.
    backup, archiver = (placement(-20_000, 800, "backup", cache=900_000, node=1),
                        placement(-20_000, 700, "log-archiver", cache=50_000, node=0))
    r = stalled_on_memory(backup, archiver, placement(-20_000, 700, "log-archiver", cache=10, node=1),
                          placement(40, 100, "vllm", cache=20_000, node=0))  # faulting its weights back, on node 0
    assert (r.cause, r.culprit) == ("memory_stall", "log-archiver (pid 700)")

    assert stalled_on_memory(backup, archiver).culprit == "backup (pid 800)"


@pytest.mark.parametrize("known", ["records", "archiver-record-not-in-yet", "cgroups-on-the-page-counts"])
def test_the_evictor_is_looked_for_under_the_stalled_process_s_memory_limit_first(known):
    # the busiest allocator on the host (a database) does not share the server's limit; the archiver
    # does. With the archiver's record not in yet, a process known to be charged elsewhere is still
    # not named; with the cgroups on the page counts themselves, no record is needed, and a big
    # allocator whose cgroup is not known at all (a build on the same host) is not named either
    records = {"records": [process(700, memory_cgroup="/serving/sidecar"), process(900, memory_cgroup="/system.slice/db")],
               "archiver-record-not-in-yet": [process(900, memory_cgroup="/system.slice/db")],
               "cgroups-on-the-page-counts": []}[known]
    on_pages = known == "cgroups-on-the-page-counts"
    a = Attributor(grace_ns=GRACE, processes=book(process(100, group=100, memory_cgroup="/serving"), *records))
    baseline(a)
    a.add_evidence(placement(-10_000, 900, "clickhouse", alloc=500_000,
                             memory_cgroup="/system.slice/db" if on_pages else ""))
    a.add_evidence(placement(-10_000, 700, "log-archiver", alloc=9_000, memory_cgroup="/serving/sidecar" if on_pages else ""))
    if on_pages:
        a.add_evidence(placement(-5_000, 800, "python", alloc=900_000))
    a.add_evidence(blocked(40, 30, kind="memory", waker=(0, 0, "swapper/0")))
    a.add_request(span("mem-2", 0, 40))
    [r] = due_after(a, 40)
    assert (r.cause, r.culprit) == ("memory_stall", "log-archiver (pid 700)")
