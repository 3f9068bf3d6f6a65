"""Per-request root cause: which kernel evidence overlapped a request.

Pure logic, no I/O: the worker feeds it evidence and request spans as they
arrive (in any order) and asks, on a timer, for the requests whose span ended
more than ``grace_ns`` ago, by then late kernel evidence has arrived too.

Evidence is matched at process level: a run-queue wait counts for a request
when it happened on one of the request's process's threads (any thread of the
host when the process is not known) and overlapped the request's time window;
only the overlapping part counts. Requests served together (continuous
batching) overlap the same waits and each is charged with them: they really
were all delayed by them.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field

from jitterscope.schemas.events import GpuIoctl, RequestAttribution, RequestSpan, RunqEvent, Suspect

Evidence = RunqEvent | GpuIoctl


def duration_ns(event: Evidence) -> int:
    """How long the evidence kept the thread from working, ending at ts_ns."""
    return event.wait_ns if isinstance(event, RunqEvent) else event.latency_ns

TOP_SUSPECTS = 3
# Excess under max(1 ms, a quarter of the baseline) is ordinary jitter: nothing to explain.
NO_EXCESS_NS = 1_000_000
NO_EXCESS_SHARE = 0.25
DOMINANT_SHARE = 0.5  # a cause must explain at least half the excess to be named
MAX_WAITS_PER_PROCESS = 200_000  # memory bound per process, whatever the horizon
REMEMBERED_KEYS = 1_000_000  # attributed span keys kept, to skip redelivered spans


@dataclass
class _Evidence:
    """One process's recent evidence of one kind, sorted by start."""

    starts: list[int] = field(default_factory=list)  # ts - duration, sorted
    events: list[Evidence] = field(default_factory=list)  # in the same order
    longest_ns: int = 0  # longest one kept: how far before a request to look

    def add(self, event: Evidence) -> None:
        length = duration_ns(event)
        index = bisect.bisect_right(self.starts, event.ts_ns - length)
        self.starts.insert(index, event.ts_ns - length)
        self.events.insert(index, event)
        self.longest_ns = max(self.longest_ns, length)
        if len(self.events) > MAX_WAITS_PER_PROCESS:
            drop = MAX_WAITS_PER_PROCESS // 10  # the oldest tenth, in one go
            del self.starts[:drop]
            del self.events[:drop]

    def expire(self, before_ns: int) -> None:
        cut = bisect.bisect_left(self.starts, before_ns)
        if cut:
            del self.starts[:cut]
            del self.events[:cut]

    def overlapping(self, start_ns: int, end_ns: int) -> list[Evidence]:
        first = bisect.bisect_left(self.starts, start_ns - self.longest_ns)
        last = bisect.bisect_right(self.starts, end_ns)
        return self.events[first:last]


def overlap_ns(event: Evidence, start_ns: int, end_ns: int) -> int:
    """How much of the event's [ts - duration, ts] lies inside [start, end]."""
    return max(0, min(end_ns, event.ts_ns) - max(start_ns, event.ts_ns - duration_ns(event)))


class Attributor:
    def __init__(self, grace_ns: int = 2_000_000_000, horizon_ns: int = 300_000_000_000,
                 slo_ns: int | None = None, slo_factor: float = 5.0, min_samples: int = 20,
                 baseline_window: int = 500, max_events_per_host: int = 200_000,
                 max_pending: int = 100_000):
        self.grace_ns = grace_ns
        self.horizon_ns = horizon_ns
        self.slo_ns = slo_ns
        self.slo_factor = slo_factor
        self.min_samples = min_samples
        # host -> (pid, kind) -> evidence; requests look up their own process directly
        self._evidence: dict[str, dict[tuple[int, type], _Evidence]] = defaultdict(lambda: defaultdict(_Evidence))
        self._newest: dict[str, int] = defaultdict(int)
        self._pending: list[RequestSpan] = []
        self._durations: dict[tuple[str, str], deque[int]] = defaultdict(lambda: deque(maxlen=baseline_window))
        self._attributed_until: dict[str, int] = {}
        self._events_per_host: dict[str, int] = defaultdict(int)
        self.max_events_per_host = max_events_per_host
        self.max_pending = max_pending
        # keys of attributed spans, oldest first: a span Kafka redelivers (or
        # a restart re-reads) is not attributed, stored and counted twice
        self._attributed: dict[tuple[str, str, int], None] = {}
        self.late_evidence = 0
        self.evidence_evicted = 0  # kept out of the window by the count bound, not by age

    # -- input -------------------------------------------------------------
    def add_evidence(self, event: Evidence) -> None:
        if event.ts_ns - duration_ns(event) < self._attributed_until.get(event.host, 0):
            self.late_evidence += 1  # some request it overlapped may already be out
        self._evidence[event.host][(event.pid, type(event))].add(event)
        self._events_per_host[event.host] += 1
        if event.ts_ns > self._newest[event.host] + self.horizon_ns // 10:
            # expire in steps of a tenth of the horizon, not on every event
            self._newest[event.host] = event.ts_ns
            self._expire(event.host, self._newest[event.host] - self.horizon_ns)
        if self._events_per_host[event.host] > self.max_events_per_host:
            self._shed(event.host)

    def remember(self, done: RequestAttribution) -> None:
        """Count an earlier attribution into the baseline (priming after a restart)."""
        self._durations[(done.host, done.name)].append(done.duration_ns)
        self._mark_attributed(done)

    def add_request(self, span: RequestSpan) -> None:
        if (span.host, span.boot_id, span.seq) not in self._attributed:
            self._pending.append(span)

    def _mark_attributed(self, record: RequestSpan | RequestAttribution) -> None:
        self._attributed[(record.host, record.boot_id, record.seq)] = None
        if len(self._attributed) > REMEMBERED_KEYS:
            del self._attributed[next(iter(self._attributed))]

    def _expire(self, host: str, before_ns: int) -> None:
        processes = self._evidence[host]
        for key, evidence in list(processes.items()):
            evidence.expire(before_ns)
            if not evidence.events:
                del processes[key]
        self._events_per_host[host] = sum(len(e.events) for e in processes.values())

    def _shed(self, host: str) -> None:
        """Over the count bound (a storm): drop the oldest tenth of the host's
        evidence in one go, so memory stays bounded whatever the rate."""
        before = self._events_per_host[host]
        starts = sorted(start for e in self._evidence[host].values() for start in e.starts)
        self._expire(host, starts[min(len(starts) - 1, before // 10)])
        self.evidence_evicted += before - self._events_per_host[host]

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- output ------------------------------------------------------------
    def due(self, now_ns: int) -> list[RequestAttribution]:
        """Attribute every request whose span ended at least grace_ns ago."""
        ready = [s for s in self._pending if s.end_ns + self.grace_ns <= now_ns]
        waiting = [s for s in self._pending if s.end_ns + self.grace_ns > now_ns]
        if len(waiting) > self.max_pending:  # memory bound: the oldest go now, with what evidence there is
            waiting.sort(key=lambda s: s.end_ns)
            ready.extend(waiting[:len(waiting) - self.max_pending])
            waiting = waiting[len(waiting) - self.max_pending:]
        if not ready:
            return []
        self._pending = waiting
        ready.sort(key=lambda s: s.end_ns)
        out = []
        for span in ready:
            key = (span.host, span.boot_id, span.seq)
            if key in self._attributed:  # the same span twice in the backlog
                continue
            out.append(self.attribute(span))
            self._mark_attributed(span)
            self._attributed_until[span.host] = max(self._attributed_until.get(span.host, 0), span.end_ns)
        return out

    def baseline_ns(self, host: str, name: str) -> tuple[int, bool]:
        """Rolling median duration of this host's requests of this name, and
        whether enough were seen to judge against it."""
        samples = self._durations.get((host, name))
        if not samples:
            return 0, False
        return int(statistics.median(samples)), len(samples) >= self.min_samples

    def attribute(self, span: RequestSpan) -> RequestAttribution:
        """The span's record key (host, boot_id, seq) is reused, so attributing
        the same span again replaces, not adds, its row."""
        duration = max(0, span.end_ns - span.start_ns)
        baseline, trusted = self.baseline_ns(span.host, span.name)
        self._durations[(span.host, span.name)].append(duration)
        if not baseline:
            baseline = duration
        excess = max(0, duration - baseline)

        # Suspects are grouped by command name: a job of many processes (a
        # backup with workers, a pool of hogs) is one suspect to move; its pid
        # is the process that held the CPU longest.
        by_suspect: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

        def charge(event: RunqEvent, part: int) -> None:
            by_suspect[event.suspect_comm][event.suspect_pid] += part

        runq = self._overlaps(span, RunqEvent, on_each=charge)
        ioctl = self._overlaps(span, GpuIoctl)
        ranked = sorted(by_suspect.items(), key=lambda item: -sum(item[1].values()))[:TOP_SUSPECTS]
        suspects = [Suspect(pid=max(pids, key=pids.get), comm=comm, wait_ns=sum(pids.values()))
                    for comm, pids in ranked]

        if excess < max(NO_EXCESS_NS, NO_EXCESS_SHARE * baseline):
            cause, explained = "none", 0.0
        else:
            # the cause that explains the most of the excess, if it explains enough
            name, ns = max((("runq_starvation", runq[0]), ("gpu_ioctl_stall", ioctl[0])), key=lambda c: c[1])
            explained = min(1.0, ns / excess)
            cause = name if explained >= DOMINANT_SHARE else "unexplained"
        slo = self.slo_ns or (int(self.slo_factor * baseline) if trusted else 0)
        return RequestAttribution(
            host=span.host, boot_id=span.boot_id, seq=span.seq, ts_ns=span.end_ns, request_id=span.request_id,
            trace_id=span.trace_id, name=span.name, pid=span.pid, start_ns=span.start_ns, end_ns=span.end_ns, duration_ns=duration, baseline_ns=baseline,
            excess_ns=excess, status=span.status, runq_wait_ns=runq[0], runq_wait_max_ns=runq[1],
            runq_waits=runq[2], suspects=suspects, cause=cause, explained=round(explained, 4),
            slo_ns=slo, slo_breached=bool(slo) and duration > slo,
            gpu_ioctl_ns=ioctl[0], gpu_ioctl_max_ns=ioctl[1], gpu_ioctls=ioctl[2],
        )

    def _overlaps(self, span: RequestSpan, kind: type, on_each=None) -> tuple[int, int, int]:
        """(total, longest, count) of the overlap of ``kind`` evidence with the
        request; pid 0 (process not known) takes every process of the host."""
        processes = self._evidence.get(span.host, {})
        if span.pid:
            sources = [processes[(span.pid, kind)]] if (span.pid, kind) in processes else []
        else:
            sources = [e for (pid, k), e in processes.items() if k is kind]
        total = longest = count = 0
        for evidence in sources:
            for event in evidence.overlapping(span.start_ns, span.end_ns):
                part = overlap_ns(event, span.start_ns, span.end_ns)
                if part > 0:
                    total += part
                    longest = max(longest, part)
                    count += 1
                    if on_each:
                        on_each(event, part)
        return total, longest, count
