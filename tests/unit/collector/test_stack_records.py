# SPDX-License-Identifier: Apache-2.0
"""collector/stacks.py and the runq signal's use of it, as pure logic (a
fake symbolizer stands in for BCC's symbol tables): a StackTrace goes out
once per distinct stack, before the first event naming it."""

from __future__ import annotations

from types import SimpleNamespace

from jitterscope.collector.probes import runq
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.collector.stacks import _Lru, stack_id
from jitterscope.common.settings import Settings
from jitterscope.schemas import events


class FakeSymbolizer:
    def __init__(self):
        self.forgotten: set[int] = set()

    def kernel(self, addrs):
        return [f"k{a:x}" for a in addrs]

    def user(self, addrs, pid):
        return [f"u{a:x}@{pid}" for a in addrs]

    def forget(self, pids):
        self.forgotten |= pids

    def close(self):
        pass


def signal_with_fakes():
    stamp = SimpleNamespace(header=lambda kind, ts: {"host": "h", "boot_id": "b", "seq": 1, "ts_ns": ts},
                            clock=SimpleNamespace(to_epoch=lambda ns: ns))
    published = []
    signal = runq.RunqSignal()
    signal.ctx = ProbeContext(settings=Settings(host="h"), stamp=stamp, publish=published.append,
                              describe_process=lambda pid: None, comm_of=lambda pid: "")
    signal.stacks = runq.RunqStacks(signal.publish_stack, FakeSymbolizer())
    return signal, published


def raw(victim=(), suspect=(0x10,)):
    return runq.RawRunqEvent(100, 9_000_000, 40, 40, 1, 77, 78, "victim", "hog",
                             victim_kernel=victim, victim_user=victim, suspect_kernel=(0xff,), suspect_user=suspect)


def test_stack_published_once_and_before_the_event():
    signal, published = signal_with_fakes()
    signal.on_event(raw(victim=(0x1,)))
    signal.on_event(raw())
    kinds = [type(r).__name__ for r in published]
    assert kinds == ["StackTrace", "StackTrace", "RunqEvent", "RunqEvent"]
    victim, suspect = published[0], published[1]
    assert (victim.pid, victim.comm, victim.kernel, victim.user) == (40, "victim", ["k1"], ["u1@40"])
    assert (suspect.pid, suspect.comm, suspect.kernel, suspect.user) == (77, "hog", ["kff"], ["u10@77"])
    first, second = published[2], published[3]
    assert (first.victim_stack, first.suspect_stack) == (victim.stack_id, suspect.stack_id)
    assert (second.victim_stack, second.suspect_stack) == (0, suspect.stack_id), "no victim stack: 0"
    assert suspect.stack_id == stack_id("hog", ["kff"], ["u10@77"])


def test_forget_frees_the_exited_processes_symbols():
    signal, _ = signal_with_fakes()
    signal.forget({77})
    assert signal.stacks.symbolizer.forgotten == {77}


def test_bounded_lru_evicts_the_oldest():
    evicted = []
    lru = _Lru(2, lambda k, v: evicted.append(k))
    for key in "abc":
        lru.put(key, 1)
    lru.put("b", 2)  # touched: now the newest
    lru.put("d", 1)
    assert evicted == ["a", "c"] and list(lru) == ["b", "d"]
    assert events.StackTrace in runq.RunqSignal.publishes
