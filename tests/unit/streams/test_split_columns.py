# SPDX-License-Identifier: Apache-2.0
"""streams/split_columns.py: splitting many run-queue parts at once gives
split_wait's answer for each, exactly (seeded random hosts: nested quota
cgroups, the idle task next, interrupt records that overlap one another and
the parts' edges, sources met more than once, records long enough to
overflow int64 products)."""

from __future__ import annotations

import random

import pytest

from jitterscope.schemas.events import CgroupThrottle, IrqTime, ProcessInfo, RunqEvent
from jitterscope.streams.culprits import split_wait
from jitterscope.streams.evidence import SortedEvidence, index_of
from jitterscope.streams.split_columns import split_many

MS = 1_000_000
T0 = 1_800_000_000_000_000_000
CGROUPS = ["/kubepods/serving/vllm", "/kubepods/serving", "/kubepods", "/system.slice/backup"]


def evidence(rng: random.Random, interval_ms: int) -> dict:
    host: dict = {}
    seq = 0
    for cgroup in CGROUPS[:3]:
        at = T0 - rng.randrange(500) * MS
        while at < T0 + 2_000 * MS:
            seq += 1
            interval = rng.choice([interval_ms, 100 * MS // MS]) * MS
            record = CgroupThrottle(host="h", boot_id="b", seq=seq, ts_ns=at + interval, cgroup=cgroup,
                                    interval_ns=interval, quota_us=1, period_us=rng.choice([1_000, 100_000]),
                                    nr_periods=1, nr_throttled=rng.choice([0, 1]),
                                    throttled_ns=rng.choice([1, 5 * MS, 20 * MS, interval]))
            host.setdefault((index_of(record), CgroupThrottle), SortedEvidence()).add(record)
            at += interval - rng.choice([0, 0, 10 * MS])  # now and then overlapping the one before
    for cpu in range(3):
        at = T0 - rng.randrange(300) * MS
        while at < T0 + 2_000 * MS:
            for source in rng.sample(["NET_RX", "TIMER", "nvme0q1"], rng.randrange(1, 4)):
                seq += 1
                interval = rng.choice([interval_ms, 50]) * MS
                record = IrqTime(host="h", boot_id="b", seq=seq, ts_ns=at + interval + rng.randrange(3) * MS, cpu=cpu,
                                 interval_ns=interval, kind=rng.choice(["softirq", "hardirq"]), source=source, count=1,
                                 time_ns=rng.choice([1, 3 * MS, interval // 2, interval * 2]))
                host.setdefault((index_of(record), IrqTime), SortedEvidence()).add(record)
            at += interval_ms * MS
    return host


def parts(rng: random.Random, n: int) -> tuple[list, list, list, list]:
    infos = [None, ProcessInfo(host="h", boot_id="b", seq=1, ts_ns=T0, pid=1, comm="p", cmdline="p", cgroup="", cpus_allowed=[0]),
             *(ProcessInfo(host="h", boot_id="b", seq=1, ts_ns=T0, pid=1, comm="p", cmdline="p", cgroup=c, cpus_allowed=[0])
               for c in CGROUPS)]
    chosen, events, los, his = [], [], [], []
    for seq in range(n):
        end = T0 + rng.randrange(-200, 2_200) * MS + rng.randrange(MS)
        wait = rng.choice([1, 10, 300, 1_000]) * MS + rng.randrange(MS)
        event = RunqEvent(host="h", boot_id="b", seq=seq, ts_ns=end, pid=1, tid=2, comm="c", cpu=rng.randrange(4),
                          wait_ns=wait, suspect_pid=rng.choice([0, 0, 900]), suspect_tid=9, suspect_comm="hog")
        lo = end - wait + rng.choice([0, 0, rng.randrange(wait)])
        chosen.append(rng.choice(infos))
        events.append(event)
        los.append(lo)
        his.append(rng.choice([end, rng.randrange(lo, end + 1)]))
    return chosen, events, los, his


@pytest.mark.parametrize("seed", range(8))
def test_split_many_is_split_wait_for_every_part(seed):
    rng = random.Random(seed)
    host = evidence(rng, rng.choice([250, 1_000]))
    infos, events, los, his = parts(rng, 400)
    expected = [split_wait(host, info, event, lo, hi) for info, event, lo, hi in zip(infos, events, los, his)]
    got = split_many(host, infos, events, los, his)
    assert got == expected
    assert all(type(value) is int for cut, _, shares, stolen in got for value in (cut, stolen, *(s[1] for s in shares)))
    assert any(split[0] for split in got) and any(split[3] for split in got)


def test_products_past_int64_take_split_wait():
    rng = random.Random(1)
    host = evidence(rng, 250)
    huge = IrqTime(host="h", boot_id="b", seq=10**6, ts_ns=T0 + 10**12, cpu=0, interval_ns=10**12 + 1, kind="softirq",
                   source="NET_RX", count=1, time_ns=10**12)
    host[(0, IrqTime)].add(huge)
    infos, events, los, his = parts(rng, 50)
    events = [e.__class__(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "cpu": 0, "wait_ns": 10**10})
              for e in events]
    los = [e.ts_ns - e.wait_ns for e in events]
    his = [e.ts_ns for e in events]
    assert split_many(host, infos, events, los, his) == [
        split_wait(host, info, event, lo, hi) for info, event, lo, hi in zip(infos, events, los, his)]
    assert split_many(host, [], [], [], []) == []


def test_interrupt_records_in_reach_that_overlap_no_part_charge_nothing():
    """A record long enough to widen the search (A) and one inside it that
    ends before the part starts (B): the search meets B, nothing overlaps;
    this raised IndexError and lost a tick's requests (issue 39)."""
    host: dict = {}
    for seq, (start, end) in enumerate([(T0 - 250 * MS, T0), (T0 - 100 * MS, T0 - 50 * MS)]):
        record = IrqTime(host="h", boot_id="b", seq=seq, ts_ns=end, cpu=0, interval_ns=end - start, kind="softirq",
                         source="NET_RX", count=1, time_ns=MS)
        host.setdefault((index_of(record), IrqTime), SortedEvidence()).add(record)
    event = RunqEvent(host="h", boot_id="b", seq=9, ts_ns=T0 + 2 * MS, pid=1, tid=2, comm="c", cpu=0,
                      wait_ns=MS, suspect_pid=900, suspect_tid=9, suspect_comm="hog")
    lo, hi = T0 + MS, T0 + 2 * MS
    assert split_many(host, [None], [event], [lo], [hi]) == [split_wait(host, None, event, lo, hi)]
