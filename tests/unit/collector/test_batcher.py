# SPDX-License-Identifier: Apache-2.0
"""collector/publish.py Batcher: the batching policy, driven by a fake clock."""

from jitterscope.collector.publish import Batcher
from jitterscope.schemas.events import ProcessInfo, RunqEvent
from jitterscope.schemas.topics import PROCESSES, RUNQ, TOPIC_OF

MS = 1_000_000


class FakeClock:
    def __init__(self, t: int = 1_000 * MS):
        self.t = t

    def __call__(self) -> int:
        return self.t


def runq(seq: int) -> RunqEvent:
    return RunqEvent(host="h", boot_id="b", seq=seq, ts_ns=seq, pid=1, tid=1, comm="c", cpu=0,
                     wait_ns=6 * MS, suspect_pid=2, suspect_tid=2, suspect_comm="s")


def proc(seq: int) -> ProcessInfo:
    return ProcessInfo(host="h", boot_id="b", seq=seq, ts_ns=seq, pid=1, comm="c", cmdline="c",
                       cgroup="/", cpus_allowed=[0])


def test_topics_come_from_the_schema():
    assert TOPIC_OF[RunqEvent] == RUNQ
    assert TOPIC_OF[ProcessInfo] == PROCESSES
    assert RUNQ != PROCESSES


def test_full_batch_is_returned_by_add():
    b = Batcher(max_records=3, max_delay_ns=200 * MS, now=FakeClock())
    assert b.add(runq(1)) == []
    assert b.add(runq(2)) == []
    out = b.add(runq(3))
    assert out == [(RUNQ, [runq(1), runq(2), runq(3)])]
    assert b.drain() == []  # nothing left behind
    assert b.next_deadline_ns() is None


def test_next_batch_starts_empty_after_a_full_one():
    b = Batcher(max_records=2, max_delay_ns=200 * MS, now=FakeClock())
    b.add(runq(1))
    b.add(runq(2))
    assert b.add(runq(3)) == []
    assert b.drain() == [(RUNQ, [runq(3)])]


def test_due_only_after_max_delay():
    clock = FakeClock()
    b = Batcher(max_records=100, max_delay_ns=200 * MS, now=clock)
    b.add(runq(1))
    clock.t += 100 * MS
    b.add(runq(2))
    clock.t += 99 * MS
    assert b.due() == []  # the oldest record is 199 ms old
    clock.t += 1 * MS
    assert b.due() == [(RUNQ, [runq(1), runq(2)])]
    assert b.due() == []  # handed out once


def test_age_counts_from_the_first_record_of_a_new_batch():
    clock = FakeClock()
    b = Batcher(max_records=100, max_delay_ns=200 * MS, now=clock)
    b.add(runq(1))
    clock.t += 200 * MS
    assert len(b.due()) == 1
    clock.t += 500 * MS  # long idle gap, then a new record
    b.add(runq(2))
    clock.t += 199 * MS
    assert b.due() == []
    clock.t += 1 * MS
    assert b.due() == [(RUNQ, [runq(2)])]


def test_topics_batch_separately():
    clock = FakeClock()
    b = Batcher(max_records=2, max_delay_ns=200 * MS, now=clock)
    assert b.add(runq(1)) == []
    clock.t += 150 * MS
    assert b.add(proc(1)) == []  # a different topic does not fill the runq batch
    assert b.add(runq(2)) == [(RUNQ, [runq(1), runq(2)])]
    clock.t += 100 * MS  # proc batch is now 100 ms old
    assert b.due() == []
    clock.t += 100 * MS
    assert b.due() == [(PROCESSES, [proc(1)])]


def test_due_returns_only_the_aged_topics():
    clock = FakeClock()
    b = Batcher(max_records=100, max_delay_ns=200 * MS, now=clock)
    b.add(runq(1))
    clock.t += 150 * MS
    b.add(proc(1))
    clock.t += 50 * MS
    assert b.due() == [(RUNQ, [runq(1)])]
    assert b.drain() == [(PROCESSES, [proc(1)])]


def test_drain_returns_everything():
    b = Batcher(max_records=100, max_delay_ns=200 * MS, now=FakeClock())
    b.add(runq(1))
    b.add(proc(1))
    b.add(runq(2))
    assert sorted(b.drain()) == sorted([(RUNQ, [runq(1), runq(2)]), (PROCESSES, [proc(1)])])
    assert b.drain() == []


def test_next_deadline_is_the_oldest_batch_plus_max_delay():
    clock = FakeClock(10_000 * MS)
    b = Batcher(max_records=100, max_delay_ns=200 * MS, now=clock)
    assert b.next_deadline_ns() is None
    b.add(runq(1))
    clock.t += 50 * MS
    b.add(proc(1))
    assert b.next_deadline_ns() == 10_200 * MS
    clock.t += 150 * MS
    b.due()  # takes the runq batch; the process batch is left
    assert b.next_deadline_ns() == 10_250 * MS
    b.drain()
    assert b.next_deadline_ns() is None


def test_an_alert_worthy_wait_sends_every_pending_batch_at_once_its_own_last():
    from jitterscope.collector.publish import alert_worthy
    from jitterscope.common.settings import Settings

    clock = FakeClock()
    b = Batcher(max_records=100, max_delay_ns=200 * MS, now=clock, urgent=alert_worthy(Settings(runq_alert_ms=10)))
    b.add(runq(1))  # 6 ms: below the alert threshold, waits for the batch delay
    assert b.due() == []
    b.add(proc(2))  # the process record an alert needs
    long_wait = RunqEvent(host="h", boot_id="b", seq=3, ts_ns=3, pid=1, tid=1, comm="c", cpu=0, wait_ns=10 * MS,
                          suspect_pid=2, suspect_tid=2, suspect_comm="s")
    b.add(long_wait)
    assert b.due() == [(PROCESSES, [proc(2)]), (RUNQ, [runq(1), long_wait])]  # no time passed: sent for the alert
    b.add(runq(4))
    assert b.due() == []  # back to the delay


def test_alerts_at_once_off_keeps_the_delay():
    from jitterscope.collector.publish import alert_worthy
    from jitterscope.common.settings import Settings

    assert alert_worthy(Settings(batch_alerts_at_once=False)) is None
    worthy = alert_worthy(Settings(runq_alert_ms=10))
    assert worthy(RunqEvent(host="h", boot_id="b", seq=1, ts_ns=1, pid=1, tid=1, comm="c", cpu=0, wait_ns=10 * MS,
                            suspect_pid=2, suspect_tid=2, suspect_comm="s"))
    assert not worthy(runq(1)) and not worthy(proc(1))
