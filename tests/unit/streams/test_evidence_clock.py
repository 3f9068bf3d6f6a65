# SPDX-License-Identifier: Apache-2.0
"""streams/evidence_clock.py and its use in Attributor.due(): a request is
attributed once every kind of evidence its host sent lately has come past
its end, before its grace period is over; a late kind, or a quiet host,
waits for the grace period."""

from __future__ import annotations

from jitterscope.schemas.events import CgroupThrottle, RequestSpan, RunqEvent
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.evidence_clock import MARGIN_NS, EvidenceClock

S = 1_000_000_000
END = 100 * S


def runq(ts_ns: int, host: str = "h", seq: int = 1) -> RunqEvent:
    return RunqEvent(host=host, boot_id="b", seq=seq, ts_ns=ts_ns, pid=7, tid=7, comm="engine", cpu=0,
                     wait_ns=1_000_000, suspect_pid=9, suspect_tid=9, suspect_comm="noisy")


def throttle(ts_ns: int, seq: int = 100) -> CgroupThrottle:
    return CgroupThrottle(host="h", boot_id="b", seq=seq, ts_ns=ts_ns, cgroup="/pod", interval_ns=S // 4,
                          quota_us=50_000, period_us=100_000, nr_periods=2, nr_throttled=0, throttled_ns=0)


def span(end_ns: int = END, seq: int = 1000) -> RequestSpan:
    return RequestSpan(host="h", boot_id="b", seq=seq, ts_ns=end_ns, trace_id="t", span_id="s", request_id="r",
                       name="generate", pid=7, start_ns=end_ns - S // 2, end_ns=end_ns, status="ok")


def test_every_kind_heard_lately_must_come_past_the_end():
    clock = EvidenceClock()
    assert not clock.past("h", END)  # nothing heard: the grace period decides
    clock.saw([runq(END - S), runq(END + MARGIN_NS)])
    assert clock.past("h", END)
    clock.saw([throttle(END - S // 4)])  # a kind heard lately that has not come that far yet
    assert not clock.past("h", END)
    clock.saw([throttle(END + S // 4)])
    assert clock.past("h", END)
    assert not clock.past("h", END + S)  # a later request: not yet
    assert not clock.past("other", END)
    clock.saw([throttle(END + 2 * S)])  # then one kind far past its end: the other has nothing for it
    assert clock.past("h", END + S) and not clock.past("h", END + 2 * S)


def test_a_kind_gone_quiet_is_not_waited_for():
    clock = EvidenceClock()
    clock.saw([throttle(END - 2 * S)])  # its cgroup stopped running before
    clock.saw([runq(END + MARGIN_NS)])
    assert clock.past("h", END)


def test_records_of_several_hosts_advance_each_its_own():
    clock = EvidenceClock()
    clock.saw([runq(END + S, host="a"), runq(END - S, host="b", seq=2)])
    assert clock.past("a", END) and not clock.past("b", END)
    clock.forget("a")
    assert not clock.past("a", END)


def test_due_attributes_before_the_grace_once_the_evidence_came_and_not_before():
    attributor = Attributor(grace_ns=2 * S)
    attributor.add_request(span())
    attributor.add_evidence_many([runq(END - S // 4)])
    assert attributor.due(END + S // 2) == []  # its evidence has not come past its end: wait
    attributor.add_evidence_many([runq(END + S // 5, seq=2)])
    done = attributor.due(END + S // 2)
    assert [d.seq for d in done] == [1000] and done[0].runq_waits == 1  # the wait in its window, charged


def test_a_quiet_host_waits_for_the_grace_period():
    attributor = Attributor(grace_ns=2 * S)
    attributor.add_request(span())
    assert attributor.due(END + S) == []
    assert [d.seq for d in attributor.due(END + 2 * S)] == [1000]
