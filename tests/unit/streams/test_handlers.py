# SPDX-License-Identifier: Apache-2.0
"""The run-queue handler never waits in the per-message path
(streams/handlers.py): a wait whose process, topology or covering throttling
record has not arrived is parked and the handler returns at once; the parked
wait is judged when its record arrives or its deadline passes, with the alert
the old in-line wait gave at the end of its wait; the waits behind it are
judged at once. Faust-free: the handlers over the worker's host state (plain
dicts) and a stub clock."""

from __future__ import annotations

import msgspec
import msgspec.inspect
from prometheus_client import REGISTRY

from jitterscope.common.settings import Settings
from jitterscope.schemas import events, signals, topics
from jitterscope.streams.alert_groups import QUIET, AlertGroups, Audience, announced, quieted
from jitterscope.streams.handlers import Handlers
from jitterscope.streams.parking import THROTTLE_WAIT_S
from jitterscope.streams.host_state import PROCESS_WAIT_S, HostState
from jitterscope.streams.rules import runq
from jitterscope.streams.rules.base import Thresholds

MS = 1_000_000
NOW = 1_800_000_000_000_000_000
HOST = "gpu-a1"
CPUS = list(range(8))
QUOTA = "/kubepods/pod1"
T = Thresholds.defaults()


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def topology(host=HOST):
    return events.Topology(host=host, boot_id="b", seq=1, ts_ns=NOW, cpus=CPUS, numa_nodes=[])


def process(pid, cgroup="/system.slice/vllm", host=HOST, serving=True):
    """A serving process (it sent request spans): its waits are announced."""
    return events.ProcessInfo(host=host, boot_id="b", seq=pid, ts_ns=NOW, pid=pid, comm=f"p{pid}",
                              cmdline="x", cgroup=cgroup, cpus_allowed=[2, 3], serving_group=pid if serving else 0)


def wait(pid, seq=1, host=HOST, ms=40, suspect=777):
    return events.RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=NOW - 50 * MS, pid=pid, tid=pid + 1,
                            comm=f"p{pid}", cpu=3, wait_ns=ms * MS, suspect_pid=suspect, suspect_tid=suspect,
                            suspect_comm="backup")


def throttle(ts_ns, throttled_ms=0, cgroup=QUOTA):
    return events.CgroupThrottle(host=HOST, boot_id="b", seq=ts_ns, ts_ns=ts_ns, cgroup=cgroup,
                                 interval_ns=250 * MS, quota_us=20_000, period_us=100_000, nr_periods=3,
                                 nr_throttled=2 if throttled_ms else 0, throttled_ns=throttled_ms * MS)


def setup(*records, max_parked=10_000):
    state, clock = HostState(), Clock()
    for r in records:
        state.learn(r)
    return Handlers(state, clock=clock, max_parked=max_parked), state, clock


def at_once(coro):
    """The coroutine's result if it finished without suspending once (no
    sleep, no future awaited: one step of the event loop); else fail."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the handler suspended: it waited in the per-message path")


def handle(h, topic, records):
    return at_once(h.handle(topic, records, NOW))


def learn(h, state, topic, records):
    """What the worker does with a message of a learned topic: the host state first, then the handlers."""
    for r in records:
        state.learn(r)
    return handle(h, topic, records)


def same(alert, expected):
    """The same alert but for the moment it was raised."""
    assert alert is not None and expected is not None
    assert msgspec.structs.replace(alert, raised_ns=0) == msgspec.structs.replace(expected, raised_ns=0)


def as_today(event, victim, throttled=()):
    """What the in-line wait judged once it ended with this victim (None: it never came), quiet
    where nobody hears of the victim (an unknown process is no serving one)."""
    alert = runq.runq_starvation(event, T.runq_alert_ns, victim, CPUS, NOW, list(throttled))
    return alert if Audience().hears_of(victim) else quieted(alert)


def counter(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_wait_without_its_process_record_returns_at_once_and_is_judged_when_it_arrives():
    h, state, clock = setup(topology())
    parked_before = counter("jitterscope_streams_runq_parked_total")
    arrived_before = counter("jitterscope_streams_runq_judged_late_total", why="arrived")
    assert handle(h, topics.RUNQ, [wait(42)]) == [] and h.parked == 1
    assert counter("jitterscope_streams_runq_parked_total") == parked_before + 1
    clock.now += 0.5
    assert h.due() == []  # its deadline has not passed
    [alert] = learn(h, state, topics.PROCESSES, [process(42)])  # the record arrives, on its own topic
    same(alert, as_today(wait(42), process(42)))
    assert alert.cpus_allowed == [2, 3] and "taskset" in alert.remedy
    assert h.parked == 0 and h.due() == []
    assert counter("jitterscope_streams_runq_judged_late_total", why="arrived") == arrived_before + 1


def test_a_parked_wait_is_judged_without_its_record_once_its_deadline_passed():
    h, state, clock = setup(topology())
    handle(h, topics.RUNQ, [wait(42)])
    learn(h, state, topics.PROCESSES, [process(43)])  # another process of the host: still waiting
    assert h.parked == 1
    clock.now += PROCESS_WAIT_S - 0.01
    assert h.due() == []
    clock.now += 0.01
    [alert] = h.due()
    same(alert, as_today(wait(42), None))  # judged as the in-line wait did when its record never came
    assert alert.cpus_allowed == [] and h.parked == 0 and h.due() == []


def test_waits_behind_a_parked_one_are_judged_at_once_in_the_same_and_later_messages():
    h, state, clock = setup(topology(), process(7))
    first = handle(h, topics.RUNQ, [wait(42, seq=1), wait(7, seq=2), wait(7, seq=3, ms=2)])  # the last: no alarm
    assert [a.seq for a in first] == [2] and h.parked == 1
    same(first[0], as_today(wait(7, seq=2), process(7)))
    later = handle(h, topics.RUNQ, [wait(7, seq=4)])
    assert [a.seq for a in later] == [4] and h.parked == 1
    [alert] = learn(h, state, topics.PROCESSES, [process(42)])
    assert alert.seq == 1 and h.parked == 0


def test_a_new_hosts_topology_is_waited_for_once():
    h, state, clock = setup(process(42, host="new"), process(42, host="silent"))
    assert handle(h, topics.RUNQ, [wait(42, host="new")]) == [] and h.parked == 1
    [alert] = learn(h, state, topics.TOPOLOGY, [topology("new")])
    assert alert.host == "new" and "taskset -apc 0-1,4-7 777" in alert.remedy

    assert handle(h, topics.RUNQ, [wait(42, host="silent")]) == []
    clock.now += PROCESS_WAIT_S
    [alert] = h.due()  # never came: judged without the host's CPUs
    assert alert.host == "silent" and "taskset" not in alert.remedy
    assert [a.host for a in handle(h, topics.RUNQ, [wait(42, seq=2, host="silent")])] == ["silent"]  # no 2nd wait


def test_a_wait_in_a_quota_cgroup_waits_for_its_covering_record_after_its_process_record():
    h, state, clock = setup(topology())
    handle(h, topics.CGROUP_THROTTLE, [throttle(NOW - 300 * MS)])  # the quota is known, not up to the wait yet
    assert handle(h, topics.RUNQ, [wait(42)]) == []
    clock.now += 0.5
    assert learn(h, state, topics.PROCESSES, [process(42, cgroup=QUOTA + "/c1")]) == [] and h.parked == 1
    clock.now += THROTTLE_WAIT_S - 0.01  # the throttling record's budget counts from the process record
    assert h.due() == []
    clock.now += 0.01
    [alert] = h.due()  # it never came: the neighbour is named, as the in-line wait did
    same(alert, as_today(wait(42), process(42, cgroup=QUOTA + "/c1")))
    assert alert.kind == "runq_starvation"


def test_a_wait_covered_by_throttling_is_judged_when_the_record_arrives():
    h, state, clock = setup(topology(), process(42, cgroup=QUOTA + "/c1"))
    handle(h, topics.CGROUP_THROTTLE, [throttle(NOW - 300 * MS)])
    assert handle(h, topics.RUNQ, [wait(42)]) == [] and h.parked == 1
    covering = throttle(NOW, throttled_ms=3)  # under the cfs_throttling alarm: no alert of its own
    [alert] = handle(h, topics.CGROUP_THROTTLE, [covering])
    same(alert, as_today(wait(42), process(42, cgroup=QUOTA + "/c1"), [covering]))
    # a covered wait in the same cgroup is judged at once
    assert [a.seq for a in handle(h, topics.RUNQ, [wait(42, seq=2)])] == [2] and h.parked == 0


def test_the_parked_list_is_bounded_the_oldest_judged_at_once_with_what_is_known():
    h, state, clock = setup(topology(), max_parked=2)
    overflow_before = counter("jitterscope_streams_runq_judged_late_total", why="overflow")
    assert handle(h, topics.RUNQ, [wait(41, seq=1), wait(42, seq=2)]) == []
    [alert] = handle(h, topics.RUNQ, [wait(43, seq=3)])
    same(alert, as_today(wait(41, seq=1), None))
    assert h.parked == 2
    assert counter("jitterscope_streams_runq_judged_late_total", why="overflow") == overflow_before + 1
    clock.now += PROCESS_WAIT_S
    assert sorted(a.seq for a in h.due()) == [2, 3] and h.parked == 0


def test_a_stop_or_hand_over_judges_every_parked_wait_with_what_is_known():
    h, state, clock = setup(topology(), process(7, cgroup=QUOTA + "/c1"))
    handle(h, topics.CGROUP_THROTTLE, [throttle(NOW - 300 * MS)])
    assert handle(h, topics.RUNQ, [wait(42, seq=1), wait(7, seq=2)]) == [] and h.parked == 2
    first, second = sorted(h.flush(), key=lambda a: a.seq)
    same(first, as_today(wait(42, seq=1), None))
    same(second, as_today(wait(7, seq=2), process(7, cgroup=QUOTA + "/c1")))
    assert h.parked == 0 and h.due() == []
    clock.now += 10
    assert h.due() == []


def test_a_record_over_no_interval_reaches_no_rule_and_is_counted():
    h, state, _ = setup(topology(), process(100))
    storm = events.Migrations(host=HOST, boot_id="b", seq=1, ts_ns=NOW, pid=100, tid=100, comm="p100",
                              interval_ns=0, migrations=8, cross_node=8, last_cpu=1)
    before = counter("jitterscope_streams_records_without_interval_total", topic=topics.MIGRATIONS)
    assert handle(h, topics.MIGRATIONS, [storm]) == []  # 8 moves in 0 s: no storm
    assert counter("jitterscope_streams_records_without_interval_total", topic=topics.MIGRATIONS) == before + 1
    # the same moves over a real second are one
    real = msgspec.structs.replace(storm, interval_ns=1_000_000_000, migrations=5_000, cross_node=5_000)
    assert [a.kind for a in handle(h, topics.MIGRATIONS, [real])] == ["migration_storm"]


def blank(record_type) -> dict:
    """A record of this type with every field empty or zero (interval 0 included)."""
    empty = {msgspec.inspect.StrType: "", msgspec.inspect.IntType: 0, msgspec.inspect.FloatType: 0.0,
             msgspec.inspect.ListType: [], msgspec.inspect.DictType: {}, msgspec.inspect.BoolType: False}
    info = msgspec.inspect.type_info(record_type)
    return {f.name: empty.get(type(f.type), None) for f in info.fields if f.required}


def test_every_signal_with_an_interval_is_guarded_before_its_handler():
    h, _, _ = setup()
    seen = []

    async def recorder(records, now_ns):
        seen.extend(records)
        return []

    guarded = 0
    for signal in signals.SIGNALS:
        if "interval_ns" not in signal.record.__struct_fields__:
            continue
        guarded += 1
        h.table[signal.topic] = recorder
        zero = msgspec.convert(blank(signal.record), signal.record)
        one = msgspec.structs.replace(zero, interval_ns=1)
        seen.clear()
        handle(h, signal.topic, [zero, one])
        assert seen == [one], signal.name
    assert guarded >= 5  # histograms, irq, throttle, migrate, pages, device_io


def test_waits_of_processes_nobody_asked_about_are_stored_quiet_and_never_announced():
    """Serving groups and GPU holders are heard of; a hog waiting for a hog, or a CLI starting up beside
    them, is stored quiet (issue 36: half a first run's console lines); announce_comms names more."""
    hog = msgspec.structs.replace(process(50, serving=False), comm="jshog")
    gpu = msgspec.structs.replace(process(51, serving=False), gpus=["0000:3b:00.0"])
    named = msgspec.structs.replace(process(52, serving=False), comm="jsvictim")
    state, clock = HostState(), Clock()
    for r in (topology(), process(42), hog, gpu, named):
        state.learn(r)
    h = Handlers(state, clock=clock, audience=Audience.from_settings(Settings()))
    alerts = {a.pid: a for a in handle(h, topics.RUNQ, [wait(pid, seq=pid) for pid in (42, 50, 51, 52)])}
    assert {pid: a.evidence.get("state") for pid, a in alerts.items()} == {
        42: None, 50: QUIET, 51: None, 52: None}
    groups = AlertGroups(60 * 10**9, 120 * 10**9)
    marked = groups.offer(list(alerts.values()), NOW)
    assert sorted(a.pid for a in marked if announced(a)) == [42, 51, 52]
    assert len(marked) == 4 and len(groups.groups) == 3, "the quiet one is stored, never grouped"
    everyone = Handlers(state, clock=clock, audience=Audience(comms=("*",)))
    assert all(announced(a) for a in handle(everyone, topics.RUNQ, [wait(50, seq=60)]))
