# SPDX-License-Identifier: Apache-2.0
"""collector/pacing.py: long loops offer the CPU up past a budget, only on
the paced thread; the longest run is what the collector publishes; own_cpus
pins every thread of the process (issue 39, part 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from jitterscope.collector import pacing
from jitterscope.common.errors import BadConfig


class FakeClock:
    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _pacer():
    clock, yields = FakeClock(), []
    return pacing.Pacer(budget_ns=500_000, clock=clock, yield_cpu=lambda: yields.append(clock.now)), clock, yields


def test_a_long_loop_yields_each_time_it_passes_the_budget_and_records_its_longest_run():
    pacer, clock, yields = _pacer()
    pacer.waiting(lambda: None)  # the loop woke at 0
    for _ in range(10):  # ten items of 0.2 ms: 2 ms of work
        clock.now += 200_000
        pacer.point()
    assert yields == [600_000, 1_200_000, 1_800_000]  # every 3 items: 0.6 ms >= 0.5 ms
    clock.now += 300_000
    pacer.waiting(lambda: None)  # the run since the last yield: 0.5 ms
    assert pacer.yields == 3 and pacer.take_longest() == 600_000
    assert pacer.take_longest() == 0 and pacer.longest_run_max == 600_000  # the interval's resets, the run's not


def test_short_turns_never_yield_and_the_wait_itself_is_not_a_run():
    pacer, clock, yields = _pacer()
    for _ in range(5):
        def wait():
            clock.now += 50_000_000  # blocked in the poll for 50 ms
        pacer.waiting(wait)
        clock.now += 100_000
        pacer.point()
    assert yields == [] and pacer.take_longest() == 100_000


def test_other_threads_pass_through_untouched():
    pacer, clock, yields = _pacer()
    pacer.waiting(lambda: None)
    clock.now += 10_000_000

    def receiver():  # an OTLP thread calling the same /proc helpers
        pacer.point()
    thread = threading.Thread(target=receiver)
    thread.start()
    thread.join()
    assert yields == []
    pacer.point()
    assert yields == [10_000_000]


def test_paced_yields_every_item():
    assert list(pacing.paced(iter([3, 1, 2]))) == [3, 1, 2]


CONFINE = """
import json, os, threading, time
from jitterscope.collector import pacing
os.sched_setaffinity(0, range(os.cpu_count()))  # every CPU first (a test runner may have pinned this one)
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
pacing.confine([CPU])
after = threading.Thread(target=stop.wait); after.start()
child = os.fork()
if child == 0:
    os._exit(0 if os.sched_getaffinity(0) == {CPU} else 3)
_, status = os.waitpid(child, 0)
tasks = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
stop.set(); before.join(); after.join()
print(json.dumps({"tasks": list(tasks.values()), "child": os.waitstatus_to_exitcode(status)}))
"""


def test_own_cpus_pin_every_thread_those_started_after_and_children():
    cpu = os.cpu_count() - 1
    if cpu < 1:
        pytest.skip("needs two CPUs to tell a pinned thread from an unpinned one")
    out = subprocess.run([sys.executable, "-c", CONFINE.replace("CPU", str(cpu))], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert len(result["tasks"]) == 3 and all(cpus == [cpu] for cpus in result["tasks"])
    assert result["child"] == 0


def test_no_own_cpus_leaves_affinity_alone_and_an_impossible_set_says_so():
    before = os.sched_getaffinity(0)
    assert pacing.confine([]) == set() and os.sched_getaffinity(0) == before
    with pytest.raises(BadConfig, match="own_cpus"):
        pacing.confine([4095])
    assert os.sched_getaffinity(0) == before


def test_settings_take_own_cpus_from_the_environment(monkeypatch):
    from jitterscope.common.settings import Settings

    assert Settings().own_cpus == []
    monkeypatch.setenv("JITTERSCOPE_OWN_CPUS", "[0]")
    assert Settings().own_cpus == [0]


def test_callbacks_inside_the_wait_start_their_run_after_the_sleep():
    pacer, clock, yields = _pacer()
    pacer.waiting(lambda: None)

    def wait():  # 50 ms asleep, then the poll hands over 4 records of 0.2 ms each
        clock.now += 50_000_000
        for _ in range(4):
            pacer.point()
            clock.now += 200_000
    pacer.waiting(wait)
    assert yields == [50_600_000]  # after 0.6 ms of callbacks, not at the first one
    pacer.waiting(lambda: None)
    assert pacer.take_longest() == 600_000


POLICY = """
import json, os, threading
from jitterscope.collector import pacing
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
pacing.yield_to_servers("POLICY")
after = threading.Thread(target=stop.wait); after.start()
child = os.fork()
if child == 0:
    os._exit(0 if os.sched_getscheduler(0) == pacing.POLICIES["POLICY"] else 3)
_, status = os.waitpid(child, 0)
tasks = [os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")]
stop.set(); before.join(); after.join()
print(json.dumps({"tasks": tasks, "child": os.waitstatus_to_exitcode(status)}))
"""


@pytest.mark.parametrize("policy", ["idle", "batch", "normal"])
def test_the_collector_policy_reaches_every_thread_those_started_after_and_children(policy):
    out = subprocess.run([sys.executable, "-c", POLICY.replace("POLICY", policy)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["tasks"] == [pacing.POLICIES[policy]] * 3 and result["child"] == 0
