# SPDX-License-Identifier: Apache-2.0
"""The collector's manners on a CPU it shares with the servers it watches.

A serving thread that becomes runnable while the collector is in the middle
of a 30 ms /proc rescan waits up to 30 ms: the collector is then the very
cause it reports (issue 39; bench/collector_slices.py measured runs of up to
15 ms, 15 a second over 1 ms). Two remedies, both here:

- :class:`Pacer`: long loops call :func:`point` at each item; past a budget
  (0.5 ms) of running since the loop last slept, the thread offers the CPU
  with ``sched_yield`` -- a no-op when nothing else is runnable on this CPU,
  a switch when a serving thread is waiting. The work is the same; its runs
  are short. It also measures the longest run it saw (from a wait's end to the
  next wait or yield), which the collector publishes (CollectorStats.longest_run_ns).
- :func:`confine`: jitterscope's own CPUs (``own_cpus``, housekeeping CPUs):
  every thread of this process, and what it starts afterwards, runs there.
- :func:`yield_to_servers`: the collector's scheduling policy
  (``collector_policy``): SCHED_IDLE runs only on a CPU no one else wants,
  SCHED_BATCH never preempts on wakeup. bench/vllm_cost.py measures both.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("jitterscope.collector")

BUDGET_NS = 500_000  # well under the 1 ms a serving thread should ever wait behind us


class Pacer:
    """Yields the CPU when one thread has run past ``budget_ns`` since it
    last slept (:meth:`waiting`) or yielded; only for the thread that last
    called :meth:`waiting` (the collector's loop): other threads that share
    code with it (the OTLP receiver's) pass through untouched."""

    def __init__(self, budget_ns: int = BUDGET_NS, clock=time.perf_counter_ns, yield_cpu=os.sched_yield):
        self.budget_ns = budget_ns
        self._clock, self._yield = clock, yield_cpu
        self._owner = None
        self._since: int | None = clock()  # None while the paced thread is in its wait
        self.longest_ns = 0  # the longest run seen since take_longest()
        self.longest_run_max = 0  # and since start
        self.yields = 0  # cumulative

    def waiting(self, wait):
        """Call ``wait`` (the loop's blocking poll): the run before it ends
        there; a new one starts at the first :meth:`point` inside it (the
        poll's callbacks handing over what it read: their work is a run
        too), or when it returns. Makes the caller's thread the paced one.
        (Before, a run was counted from before the wait, so the first
        callback after a 50 ms sleep "ran" 50 ms and yielded at once.)"""
        me = threading.get_ident()
        if self._owner == me and self._since is not None:
            self._note(self._clock() - self._since)
        self._owner, self._since = me, None  # asleep
        try:
            return wait()
        finally:
            if self._since is None:  # no callback ran: the run starts now
                self._since = self._clock()

    def _note(self, ran: int) -> None:
        self.longest_ns = max(self.longest_ns, ran)
        self.longest_run_max = max(self.longest_run_max, ran)

    def point(self) -> None:
        """One item of a long loop done: yield if this run is over budget."""
        if self._owner != threading.get_ident():
            return
        if self._since is None:  # the first item after a sleep: a run starts
            self._since = self._clock()
            return
        ran = self._clock() - self._since
        if ran >= self.budget_ns:
            self._note(ran)
            self.yields += 1
            self._yield()
            self._since = self._clock()

    def take_longest(self) -> int:
        """The longest run since the last call (ns), then start afresh."""
        longest, self.longest_ns = self.longest_ns, 0
        return longest


PACER = Pacer()
point = PACER.point  # for the loops over /proc and over records: one call per item


def paced(items):
    """``items``, with a pace point after each."""
    for item in items:
        yield item
        PACER.point()


def _each_thread(task_dir: Path, apply) -> None:
    """``apply(tid)`` for every thread of this process running now (affinity and policy are per thread;
    new threads and children inherit their creator's), past those that end meanwhile."""
    for entry in os.listdir(task_dir):
        try:
            apply(int(entry))
        except ProcessLookupError:
            continue


def confine(cpus: list[int], task_dir: Path = Path("/proc/self/task")) -> set[int]:
    """Pin every thread of this process (those running now: affinity is per
    thread, and new threads and children inherit their creator's) to
    ``cpus``; nothing when empty. Raises BadConfig with the fix when the
    kernel refuses the set (no CPU of it online or in this cgroup's cpuset)."""
    from jitterscope.common.errors import BadConfig

    if not cpus:
        return set()
    wanted = set(cpus)
    try:
        _each_thread(task_dir, lambda tid: os.sched_setaffinity(tid, wanted))
    except OSError as exc:
        raise BadConfig(f"own_cpus {sorted(wanted)}: the kernel refused it ({exc.strerror}); give CPUs this "
                        f"host has online and this cgroup allows (now: {sorted(os.sched_getaffinity(0))})") from exc
    log.info("confined to own_cpus", extra={"cpus": sorted(wanted)})
    return wanted


POLICIES = {"normal": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE}


def yield_to_servers(policy: str, task_dir: Path = Path("/proc/self/task")) -> None:
    """Give every thread of this process (and so what they start afterwards:
    a policy is inherited) the scheduling ``policy`` of POLICIES; "normal"
    leaves them as they are."""
    if policy == "normal":
        return
    _each_thread(task_dir, lambda tid: os.sched_setscheduler(tid, POLICIES[policy], os.sched_param(0)))
    log.info("collector scheduling policy set", extra={"policy": policy})
