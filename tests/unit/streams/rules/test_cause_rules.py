# SPDX-License-Identifier: Apache-2.0
"""The irq and cfs_throttling rules (streams/rules/irq.py, throttle.py), the
run-queue rule's throttled case (rules/runq.py) and their handlers with the
worker's real HostState: each alert fires on its evidence, stays quiet
without it, and its remedy names the IRQ, CPUs, cgroup and quota."""

from __future__ import annotations

import asyncio

from jitterscope.schemas import events, topics
from jitterscope.streams.handlers import Handlers
from jitterscope.streams.host_state import HostState
from jitterscope.streams.rules import irq, runq, throttle
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.throttle_index import ThrottleIndex

MS = 1_000_000
NOW = 1_800_000_000_000_000_000
T = Thresholds.defaults()
HOST = "gpu-a1"
POD_CG = "/kubepods/burstable/pod1234"
CG = POD_CG + "/abcdef"


def hdr(seq=1, ts_ns=NOW):
    return dict(host=HOST, boot_id="b", seq=seq, ts_ns=ts_ns)


def irq_time(share, kind="hardirq", source="41:virtio3-rx", cpu=3, interval_ms=250):
    return events.IrqTime(**hdr(), cpu=cpu, interval_ns=interval_ms * MS, kind=kind, source=source,
                          count=5000, time_ns=int(share * interval_ms * MS))


def throttled(ms, cgroup=CG, ts_ns=NOW, interval_ms=250, nr_throttled=2):
    return events.CgroupThrottle(**hdr(ts_ns=ts_ns), cgroup=cgroup, interval_ns=interval_ms * MS, quota_us=20_000,
                                 period_us=100_000, nr_periods=3, nr_throttled=nr_throttled,
                                 throttled_ns=int(ms * MS))


def process(pid=4242, cgroup=CG, cpus=(2, 3), pod="", serving=0):
    return events.ProcessInfo(**hdr(), pid=pid, comm="vllm", cmdline="vllm serve", cgroup=cgroup,
                              cpus_allowed=list(cpus), serving_group=serving, pod=pod,
                              namespace="llm" if pod else "", container="engine" if pod else "")


def wait(ms=80, pid=4242, ts_ns=NOW - 50 * MS, suspect=0):
    return events.RunqEvent(**hdr(ts_ns=ts_ns), pid=pid, tid=pid + 1, comm="vllm", cpu=3, wait_ns=int(ms * MS),
                            suspect_pid=suspect, suspect_tid=suspect, suspect_comm="backup" if suspect else "")


def state(*records):
    s = HostState()
    s.learn(events.Topology(**hdr(), cpus=list(range(8)), numa_nodes=[]))
    for r in records:
        s.learn(r)
    return s


def run(handlers, topic, records):
    return asyncio.run(handlers.handle(topic, records, NOW))


def test_irq_alert_over_the_share_names_the_irq_and_cpus_away_from_serving():
    assert irq.irq_time(irq_time(0.1), {2, 3}, list(range(8)), T, NOW) is None
    alert = irq.irq_time(irq_time(0.4), {2, 3}, list(range(8)), T, NOW)
    assert alert.kind == "irq" and alert.cpu == 3 and "40%" in alert.summary
    assert "echo 0-1,4-7 > /proc/irq/41/smp_affinity_list" in alert.remedy and "virtio3-rx" in alert.remedy
    net = irq.irq_time(irq_time(0.6, "softirq", "NET_RX"), {2, 3}, list(range(8)), T, NOW)
    assert net.severity == "critical" and "RPS" in net.remedy and "RSS" in net.remedy


def test_a_vcpu_the_hypervisor_took_is_told_as_steal_with_no_irq_to_move():
    alert = irq.irq_time(irq_time(0.3, "steal", "hypervisor"), {2, 3}, list(range(8)), T, NOW)
    assert alert.kind == "irq" and alert.evidence["kind"] == "steal"
    assert "the hypervisor (steal time) took 30% of CPU 3" in alert.summary
    assert "dedicated vCPUs" in alert.remedy and "/proc/irq" not in alert.remedy


def test_irq_handler_alerts_once_per_quiet_period():
    h = Handlers(state(process(serving=4242)))
    assert [a.kind for a in run(h, topics.IRQ, [irq_time(0.5)])] == ["irq"]
    assert run(h, topics.IRQ, [irq_time(0.5)]) == []  # same CPU and source: quiet
    assert [a.cpu for a in run(h, topics.IRQ, [irq_time(0.5, cpu=5)])] == [5]


def test_cfs_throttling_needs_a_watched_process_in_the_cgroup_and_the_threshold():
    holder = process(pod="vllm-0")
    assert throttle.cfs_throttling(throttled(5), holder, T, NOW) is None
    assert throttle.cfs_throttling(throttled(200), None, T, NOW) is None
    alert = throttle.cfs_throttling(throttled(200), holder, T, NOW)
    assert alert.kind == "cfs_throttling" and (alert.pod, alert.namespace, alert.container) == ("vllm-0", "llm", "engine")
    assert "throttled 200 ms" in alert.summary and "0.2 CPUs" in alert.summary
    assert "static CPU manager policy" in alert.remedy and "kubectl set resources -n llm" in alert.remedy


def test_cfs_handler_alerts_for_a_pod_quota_above_the_process_not_for_strangers():
    h = Handlers(state(process()))
    assert [a.kind for a in run(h, topics.CGROUP_THROTTLE, [throttled(200, cgroup=POD_CG)])] == ["cfs_throttling"]
    assert run(h, topics.CGROUP_THROTTLE, [throttled(200, cgroup="/other", ts_ns=NOW + 1)]) == []


def test_runq_wait_during_throttling_is_not_blamed_on_the_neighbour():
    index = ThrottleIndex()
    index.add(throttled(200))
    records = index.throttled(HOST, CG, NOW - 130 * MS, NOW - 50 * MS)
    alert = runq.runq_starvation(wait(suspect=777), 10 * MS, process(), list(range(8)), NOW, records)
    assert alert.kind == "cfs_throttling" and alert.suspect_pid == 0 and "cgroup " + CG in alert.summary
    assert "taskset" not in alert.remedy and "cpu.cfs_quota_us" in alert.remedy
    # no throttling overlaps the wait (the record's interval and the period
    # before it: throttled_span), or too little of it: the neighbour is named
    assert index.throttled(HOST, CG, NOW - 500 * MS, NOW - 350 * MS) == []
    little = [throttled(20)]
    assert runq.runq_starvation(wait(suspect=777), 10 * MS, process(), list(range(8)), NOW, little).kind \
        == "runq_starvation"
    assert runq.runq_starvation(wait(suspect=777), 10 * MS, process(), list(range(8)), NOW).kind == "runq_starvation"
    # ... unless the CPU sat idle meanwhile: then only the quota held the thread back
    assert runq.runq_starvation(wait(), 10 * MS, process(), list(range(8)), NOW, little).kind == "cfs_throttling"


def test_runq_handler_waits_for_the_covering_record_then_blames_the_quota():
    h = Handlers(state(process()))
    run(h, topics.CGROUP_THROTTLE, [throttled(0, ts_ns=NOW - 300 * MS, nr_throttled=0)])  # quota cgroup known

    # the handler returns at once; the wait is parked for the record that covers it
    assert run(h, topics.RUNQ, [wait(suspect=777)]) == [] and h.parked == 1
    own = run(h, topics.CGROUP_THROTTLE, [throttled(200)])  # it arrives later, on its own topic
    # the wait is judged then, and is explained by the same throttling, inside
    # the cgroup's quiet period: no second alert, and above all no neighbour blamed
    assert [a.kind for a in own] == ["cfs_throttling"] and h.parked == 0
    assert h.due() == []


def test_a_throttled_stretch_is_counted_from_before_the_interval_whose_counters_it_moved():
    """cpu.stat moves nr_throttled and throttled_time when a throttled
    stretch ends. The CI run that failed: a thread first throttled 30 ms
    before a sampler boundary, run again 6.5 ms after it. The interval
    before the boundary shows no throttling; the one after it does. With
    the idle task next, the wait is the quota's, not the kernel's."""
    boundary = NOW - 200 * MS
    before = throttled(0, ts_ns=boundary, nr_throttled=0)  # it ran under its quota, then was throttled
    after = throttled(80, ts_ns=boundary + 250 * MS, nr_throttled=2)
    stretch = wait(36.5, ts_ns=boundary + int(6.5 * MS))
    index = ThrottleIndex()
    index.add(before)
    index.add(after)
    records = index.throttled(HOST, CG, stretch.ts_ns - stretch.wait_ns, stretch.ts_ns)
    assert records == [after]
    alert = runq.runq_starvation(stretch, 10 * MS, process(), list(range(8)), NOW, records)
    assert alert.kind == "cfs_throttling" and "~36 ms throttled during the wait" in alert.summary
    # another task ran next: it may have held the CPU, and the spread counts (6.5 of 36.5 ms at most)
    assert runq.runq_starvation(wait(36.5, ts_ns=stretch.ts_ns, suspect=777), 10 * MS, process(), list(range(8)),
                                NOW, records).kind == "runq_starvation"
    # through the handler, as the worker judges it: the quota's alert (raised
    # by the record itself) says it all, the kernel is not blamed
    h = Handlers(state(process()))
    assert [a.kind for a in run(h, topics.CGROUP_THROTTLE, [before, after])] == ["cfs_throttling"]
    assert run(h, topics.RUNQ, [stretch]) == [] and h.parked == 0
    # a period before the interval, no more
    assert throttle.throttled_during([after], boundary - 150 * MS, boundary - 100 * MS, whole=True) == 0
    assert throttle.throttled_during([after], boundary - 150 * MS, boundary, whole=True) == 100 * MS


def test_runq_handler_unthrottled_cgroup_still_names_the_neighbour():
    h = Handlers(state(process()))
    run(h, topics.CGROUP_THROTTLE, [throttled(0, ts_ns=NOW, nr_throttled=0)])
    assert [a.kind for a in run(h, topics.RUNQ, [wait(suspect=777)])] == ["runq_starvation"]


def test_throttled_during_spreads_a_record_over_its_interval():
    r = throttled(100)  # 100 ms in 250 ms
    assert throttle.throttled_during([r], NOW - 250 * MS, NOW) == 100 * MS
    assert throttle.throttled_during([r], NOW - 125 * MS, NOW) == 50 * MS
    assert throttle.throttled_during([r], NOW, NOW + MS) == 0
    assert throttle.throttled_during([r], NOW - 125 * MS, NOW, whole=True) == 125 * MS
