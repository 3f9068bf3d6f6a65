# SPDX-License-Identifier: Apache-2.0
"""What the collector takes from span senders, bounded (issue 40, items 4
and 5): any local process may send spans, so none may make the collector
hold unbounded spans, nor fill the probes' target maps.

- Spans: a request body is cut to ``otlp_max_spans_per_request`` before its
  spans are converted (a ~4 KB gzip body inflates to ~70k spans); each
  sender draws from a token bucket (``otlp_sender_spans_per_s``, burst
  ``otlp_sender_burst_spans``); the queue to the agent loop holds at most
  ``otlp_queue_max_spans``. What does not fit is shed, counted by reason, and
  the sender is told (an OTLP partial success, 429 or 503: senders back off).
- Serving heads (the processes whose spans make their groups probe targets):
  at most ``serving_heads_per_sender`` per sender; the groups' members
  watched on the host at most ``serving_targets_max``, the earliest heads'
  first, so a flood of new heads cannot push out what is already watched.

A sender is its uid when its connection's process is known (one user's many
processes are one sender), else its address.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import Callable

from prometheus_client import Counter

from jitterscope.collector.otlp.convert import OtlpError

SPANS_SHED = Counter("jitterscope_collector_spans_shed_total",
                     "request spans refused before the agent loop, by reason (request_cap: over the spans of one "
                     "body; sender_rate: over its sender's rate; queue_full: the agent loop's queue was full)",
                     ["reason"])
HEADS_REFUSED = Counter("jitterscope_collector_serving_heads_refused_total",
                        "span processes not made serving heads: their sender had serving_heads_per_sender already")
TARGETS_REFUSED = Counter("jitterscope_collector_targets_refused_total",
                          "processes not watched: over serving_targets_max (where=host) or with no room left in a "
                          "probe's target map (where=the probe)", ["where"])
MAX_SENDERS = 4096  # token buckets kept; the least recently used go first (a new one starts full)
MAX_REMEMBERED = 65536  # refused pids remembered, so each is counted once


class _Once:
    """Counts each key once until it is forgotten (bounded)."""

    def __init__(self):
        self.seen: set = set()
        self.total = 0

    def add(self, keys) -> None:
        new = set(keys) - self.seen
        if len(self.seen) + len(new) > MAX_REMEMBERED:
            self.seen.clear()
        self.seen |= new
        self.total += len(new)


class Intake:
    """One per collector; ``admit`` and ``put`` run on the OTLP server's
    threads, the rest on the agent loop."""

    def __init__(self, settings, clock: Callable[[], float] = time.monotonic):
        s = settings
        self.per_request = s.otlp_max_spans_per_request
        self.rate, self.burst = s.otlp_sender_spans_per_s, float(s.otlp_sender_burst_spans)
        self.max_queued = s.otlp_queue_max_spans
        self.heads_per_sender, self.max_targets = s.serving_heads_per_sender, s.serving_targets_max
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # sender -> (tokens, at)
        self._queue: deque[tuple[str, list[dict]]] = deque()
        self.queued = 0  # spans in the queue now
        self.shed = {"request_cap": 0, "sender_rate": 0, "queue_full": 0}
        self.heads: dict[int, str] = {}  # admitted head -> its sender, in admission order
        self._per_sender: dict[str, int] = {}
        self.heads_refused, self.over_host = _Once(), _Once()

    # -- spans (OTLP threads) -------------------------------------------
    def admit(self, sender: str, spans: int) -> int:
        """How many of a body's ``spans`` may be converted (the rest are
        shed and counted); raises OtlpError 429 when none may."""
        take = min(spans, self.per_request)
        with self._lock:
            self.shed["request_cap"] += spans - take
            tokens, at = self._buckets.pop(sender, (self.burst, self._clock()))
            now = self._clock()
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            allowed = min(take, int(tokens))
            self._buckets[sender] = (tokens - allowed, now)
            if len(self._buckets) > MAX_SENDERS:
                self._buckets.popitem(last=False)
            self.shed["sender_rate"] += take - allowed
        if not allowed and take:
            raise OtlpError(429, f"over this sender's {self.rate:g} spans/s: retry later")
        return allowed

    def put(self, sender: str, records: list[dict]) -> None:
        """Queue a body's request records for the agent loop; raises
        OtlpError 503 (and counts them shed) when the queue is full."""
        with self._lock:
            if self.queued + len(records) > self.max_queued:
                self.shed["queue_full"] += len(records)
                raise OtlpError(503, "the collector's span queue is full: retry later")
            self._queue.append((sender, records))
            self.queued += len(records)

    def take(self) -> list[tuple[str, list[dict]]]:
        """Everything queued, (sender, records) in arrival order."""
        with self._lock:
            taken, self._queue = list(self._queue), deque()
            self.queued = 0
        return taken

    # -- serving heads and targets (agent loop) ---------------------------
    def admit_head(self, pid: int, sender: str) -> bool:
        """Whether span process ``pid`` may become a serving head."""
        if pid in self.heads:
            return True
        if self._per_sender.get(sender, 0) >= self.heads_per_sender:
            self.heads_refused.add([pid])
            return False
        self.heads[pid] = sender
        self._per_sender[sender] = self._per_sender.get(sender, 0) + 1
        return True

    def keep_heads(self, alive: set[int]) -> None:
        """Forget the heads not in ``alive`` (exited): their senders' room frees."""
        for pid in [p for p in self.heads if p not in alive]:
            sender = self.heads.pop(pid)
            self._per_sender[sender] -= 1
        self.heads_refused.seen &= alive

    def bound_targets(self, groups: dict[int, int]) -> dict[int, int]:
        """``groups`` (member -> head, serving_group.find_groups) cut to
        ``serving_targets_max`` members: heads admitted by other means
        first, then in admission order, each with its nearest members."""
        order = {head: i for i, head in enumerate(self.heads)}
        by_head: dict[int, list[int]] = {}
        for pid, head in groups.items():
            by_head.setdefault(head, []).append(pid)
        kept: dict[int, int] = {}
        for head in sorted(by_head, key=lambda h: (order.get(h, -1), h)):
            for pid in by_head[head]:
                if len(kept) < self.max_targets:
                    kept[pid] = head
        over = groups.keys() - kept.keys()
        self.over_host.add(over)
        self.over_host.seen &= set(groups)
        return kept

    def export(self, exported: Callable, probes) -> None:
        """Its counts (and the probes' target-map refusals) to Prometheus;
        ``exported``: the agent's _Exported."""
        for reason, n in self.shed.items():
            exported(SPANS_SHED, n, reason)
        exported(HEADS_REFUSED, self.heads_refused.total)
        exported(TARGETS_REFUSED, self.over_host.total, "host")
        for probe in probes:
            exported(TARGETS_REFUSED, probe.targets_refused(), probe.name)
