# SPDX-License-Identifier: Apache-2.0
"""Run-queue waits parked until the records they are judged with arrive
(streams/handlers.py's ``runq``). Pure logic, no I/O.

A run-queue wait is judged with its process record, its host's topology and,
when a quota cgroup is known above it, the throttling record that covers its
end; those travel on other topics and may arrive just after it. A wait whose
records are all known is judged at once (the handler's common case); the
others are *parked* here (at most ``max_parked``, each with a deadline:
PROCESS_WAIT_S for the process and topology records, then THROTTLE_WAIT_S
for the throttling record) and the handler returns without waiting, so the
waits behind them are judged at once too.

A parked wait is judged again when a record of its host arrives (a
processes, topology or cgroup_throttle message: ``wake``, whose alerts the
handler returns with the message's own) or, once its deadline passed, by
``due()``, which the worker calls from a short timer: as the old in-line
wait (which polled every 50 ms inside the per-message path, so every record
behind a waiting one waited too) judged it at the end of its wait. Parked
rather than a task per waiting event: a task per alert-worthy event costs
more than the rule itself, and the wake-up by host judges a parked wait in
the same loop iteration that its record is learned, not at the next poll. A
parked wait's message is stored and committed meanwhile, so the worker
judges every parked wait with what is known (``flush()``) before it stops or
hands partitions over.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from prometheus_client import Counter

from jitterscope.schemas import events, topics
from jitterscope.streams.host_state import PROCESS_WAIT_S
from jitterscope.streams.throttle_index import ThrottleIndex

#: how long a run-queue wait in a quota cgroup waits for the throttling
#: record that covers it (the cfs sampler publishes every cfs_interval_s,
#: then the batch delay): judged without it after that
THROTTLE_WAIT_S = 2.0
#: run-queue waits parked at most at once per worker; past it the oldest is judged at once with what is known
MAX_PARKED = 10_000
#: the topics whose records a parked wait may wait for: each of their
#: messages judges its host's parked waits again (the host state learned the
#: process and topology records before, in streams/app.py)
WAKING = frozenset({topics.PROCESSES, topics.TOPOLOGY, topics.CGROUP_THROTTLE})

PARKED = Counter("jitterscope_streams_runq_parked_total",
                 "alert-worthy run-queue waits parked for a record on another topic (process, topology, throttling)")
JUDGED_LATE = Counter("jitterscope_streams_runq_judged_late_total",
                      "parked run-queue waits judged, by why: the record arrived, its deadline passed, "
                      "the parked list was full (overflow), the worker stopped or handed partitions over (flush)",
                      ["why"])

#: the run-queue rule with what is known now: (wait, its process record or None) -> its alert, if any
Judge = Callable[[events.RunqEvent, events.ProcessInfo | None], events.Alert | None]


@dataclass(slots=True, eq=False)
class Parked:
    """A run-queue wait waiting for a record. Times are the clock's (monotonic seconds)."""

    event: events.RunqEvent
    process_until: float  # waits for its process (and topology) record until then
    until: float = 0.0  # the deadline it waits for now
    throttle_until: float = 0.0  # non-zero: its victim is known, it waits for the covering throttling record
    victim: events.ProcessInfo | None = None


class ParkedWaits:
    """``state``: the worker's HostState (its process and topology look-ups);
    ``throttles``: the handlers' throttle index (which quota cgroups are
    known above a thread, and how far their records reach); ``judge``: the
    run-queue rule; ``clock``: monotonic seconds, for the deadlines."""

    def __init__(self, state, throttles: ThrottleIndex, judge: Judge, clock: Callable[[], float],
                 max_parked: int = MAX_PARKED):
        self.state, self.throttles, self.judge = state, throttles, judge
        self.clock, self.max_parked = clock, max_parked
        #: parked waits, oldest first; the same per host; their deadlines (a heap, stale items skipped)
        self._parked: dict[int, Parked] = {}
        self._by_host: dict[str, dict[int, Parked]] = defaultdict(dict)
        self._deadlines: list[tuple[float, int]] = []
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._parked)

    def take(self, event: events.RunqEvent, now: float, out: list[events.Alert]) -> None:
        """A wait some of whose records are not known yet: park it, or judge it now (into ``out``) if it
        waits for nothing after all (its records came, or its deadlines are already past)."""
        parked = Parked(event, process_until=now + PROCESS_WAIT_S)
        until = self._waiting_until(parked, now)
        if until is not None:
            self._park(parked, until, out)
        elif alert := self.judge(event, parked.victim):
            out.append(alert)

    def due(self) -> list[events.Alert]:
        """Judge the parked waits whose deadline passed, as the old in-line
        wait did at its end; the worker calls this from a short timer."""
        now, out = self.clock(), list[events.Alert]()
        while self._deadlines and self._deadlines[0][0] <= now:
            until, key = heapq.heappop(self._deadlines)
            parked = self._parked.get(key)
            if parked is not None and parked.until == until:  # else judged already, or its deadline moved
                self._step(key, parked, now, out)
        return out

    def flush(self) -> list[events.Alert]:
        """Judge every parked wait now with what is known: when the worker
        stops or hands partitions over (its messages are stored and
        committed, so no other worker would judge them)."""
        out: list[events.Alert] = []
        for key, parked in list(self._parked.items()):
            self._judge_now(key, parked, "flush", out)
        self._deadlines.clear()
        return out

    def wake(self, hosts) -> list[events.Alert]:
        """A record of these hosts arrived: judge their parked waits that no longer wait."""
        out: list[events.Alert] = []
        now = None
        for host in hosts:
            if waiting := self._by_host.get(host):
                now = self.clock() if now is None else now
                for key, parked in list(waiting.items()):
                    self._step(key, parked, now, out)
        return out

    def _waiting_until(self, parked: Parked, now: float) -> float | None:
        """Until when a wait still waits for a record (the deadline of what
        it waits for); None: judge it now. The same budgets as the in-line
        wait had: its process record and its host's topology first (one
        window per host, HostState.topology_due), then the throttling record
        that covers its end when a quota cgroup is known above it."""
        event = parked.event
        if not parked.throttle_until:
            victim = self.state.processes.get((event.host, event.pid))
            waits = []
            if victim is None and now < parked.process_until:
                waits.append(parked.process_until)
            if (topology := self.state.topology_due(event.host, now)) is not None:
                waits.append(topology)
            if waits:
                return max(waits)
            parked.victim = victim
            if not self.throttles.limited(event.host, victim):
                return None
            parked.throttle_until = now + THROTTLE_WAIT_S
        if now >= parked.throttle_until or parked.victim is None or \
                self.throttles.covered_until(event.host, parked.victim.cgroup) >= event.ts_ns:
            return None
        return parked.throttle_until

    def _park(self, parked: Parked, until: float, out: list[events.Alert]) -> None:
        if len(self._parked) >= self.max_parked:  # full: the oldest is judged now with what is known
            self._judge_now(*next(iter(self._parked.items())), "overflow", out)
        key = next(self._ids)
        parked.until = until
        self._parked[key] = parked
        self._by_host[parked.event.host][key] = parked
        heapq.heappush(self._deadlines, (until, key))
        PARKED.inc()

    def _judge_now(self, key: int, parked: Parked, why: str, out: list[events.Alert]) -> None:
        """Judge a parked wait before what it waits for came, with what is known."""
        self._unpark(key, parked)
        JUDGED_LATE.labels(why).inc()
        event = parked.event
        victim = parked.victim if parked.throttle_until else self.state.processes.get((event.host, event.pid))
        if alert := self.judge(event, victim):
            out.append(alert)

    def _unpark(self, key: int, parked: Parked) -> None:
        del self._parked[key]
        host = self._by_host[parked.event.host]
        del host[key]
        if not host:
            del self._by_host[parked.event.host]

    def _step(self, key: int, parked: Parked, now: float, out: list[events.Alert]) -> None:
        """Judge a parked wait if it no longer waits, else move its deadline."""
        until = self._waiting_until(parked, now)
        if until is None:
            self._unpark(key, parked)
            JUDGED_LATE.labels("arrived" if now < parked.until else "deadline").inc()
            if alert := self.judge(parked.event, parked.victim):
                out.append(alert)
        elif until != parked.until:
            parked.until = until
            heapq.heappush(self._deadlines, (until, key))
