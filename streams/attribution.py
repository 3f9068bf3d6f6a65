# SPDX-License-Identifier: Apache-2.0
"""Per-request root cause: which kernel evidence overlapped a request.

Pure logic, no I/O: the worker feeds it evidence and request spans as they arrive (in any
order) and asks, on a timer, for the requests whose evidence has come (or ``grace_ns`` passed).

Evidence is matched at process level: a run-queue wait counts for a request when it happened on a thread of the
request's serving group (the span's process and the processes the collector found serving with it, e.g. vLLM's
EngineCore: ProcessInfo.serving_group; any thread of the host when the process is not known) and overlapped the
request's time window; only the overlapping part counts, and a thread's time is counted once (a redelivered or
re-primed event does not double it). Requests served together (continuous batching) overlap the same waits, and
each is charged with them.

A wait is then split by what kept the CPU from the thread:
- ``cfs_throttling``: the part that overlaps intervals in which the cgroup of the thread's process (or an
  ancestor: a pod's limit throttles its containers) was throttled. A CgroupThrottle record only says how long
  the cgroup was throttled over its interval, not when, so the charge assumes it was spread evenly: throttled_ns
  x overlap / interval_ns, at most the overlap. Exception: when nothing else ran on the CPU during the wait (its
  suspect is the idle task, pid 0), a runnable thread can only have been held back by its quota, and the whole
  overlap is throttling -- with the quota period before the interval (cpu.stat counts a throttled stretch when
  it ends: streams/throttle_index.py, ``throttled_span``).
- ``irq``: interrupt time on the wait's CPU during the wait: each overlapping IrqTime interval's time_ns
  prorated by the overlap (again assuming an even spread), at most what the wait has left after throttling.
- ``self_contention``: of the rest, what the group's own threads held (the CPU's holder is a process of the
  request's serving group): more runnable threads than CPUs; never a neighbour's, and the group's threads are
  never suspects. Waits behind its GIL's holders weigh for ``gil_contention``.
- idle: of the rest, what the idle task held (suspect pid 0: an idle CPU waking; a VM's vCPU back from the
  hypervisor): run-queue time, no one's.
- ``runq_starvation``: the rest; only this part is charged to the suspects (the tasks outside the group).

Cost: due() indexes each serving group's run-queue waits once per batch, in numpy columns
(streams/wait_columns.py; ties and overlapping waits: streams/wait_index.py and the walk).
Beside it: evidence.py (the evidence), thread_budget.py (the carrying thread's time), wait_chain.py
(whom it slept on), causes.py (the causes the charges name), culprits.py (whom to name), phases.py (per phase).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import fields
from functools import partial

from msgspec.structs import replace

from jitterscope.schemas.events import (CauseShare, CgroupThrottle, GpuIoctl, GpuTelemetry, GpuXid, IrqTime,
                                        ProcessInfo, RequestAttribution, RequestSpan, RunqEvent)
from jitterscope.schemas.nvidia import ioctl_name
from jitterscope.streams.causes import (DOMINANT_SHARE, MIN_SHARE, USUAL_AFTER, USUAL_QUANTILE, Charges,
                                        self_contention_ns, weigh)
from jitterscope.streams.culprits import Culprits, CulpritStacks, evictor, latest_throttle, split_wait
from jitterscope.streams.evidence_clock import EvidenceClock
from jitterscope.streams.gpu_events import GpuEvents, culprit as gpu_culprit
from jitterscope.streams.host_state import ProcessBook
from jitterscope.streams.phases import inter_token_ns, phase_parts, windows_wanted
from jitterscope.streams.evidence import (MAX_WAITS_PER_PROCESS, Evidence, HostEvidence, Part, SortedEvidence,
                                          add_calls, duration_ns, index_of, kth_smallest, thread_parts, union_ns)
from jitterscope.streams.thread_budget import (ThreadBudget, behind_own_ns, carried_parts, kind_of,
                                               runq_per_thread, thread_budget)
from jitterscope.streams.wait_columns import ColumnarIndex
from jitterscope.streams.wait_index import TOP_SUSPECTS, SplitCache, Tie, WaitIndex, rank_suspects
from jitterscope.streams.rolling_median import RollingMedian
from jitterscope.streams.span_keys import SpanKeys
from jitterscope.streams.split_columns import split_many
from jitterscope.streams.throttle_index import throttled_span
from jitterscope.streams.token_slo import TokenObjectives
from jitterscope.streams.wait_chain import chained_stalls, wait_chain

REMEMBERED_KEYS = 1_000_000  # attributed span keys kept, to skip redelivered spans


class Attributor:
    def __init__(self, grace_ns: int = 2_000_000_000, horizon_ns: int = 300_000_000_000,
                 slo_ns: int | None = None, slo_factor: float = 5.0, min_samples: int = 20,
                 baseline_window: int = 500, max_events_per_host: int = 200_000,
                 max_pending: int = 100_000, processes: ProcessBook | None = None,
                 tokens: TokenObjectives = TokenObjectives({}, {})):
        self.grace_ns, self.horizon_ns, self.tokens = grace_ns, horizon_ns, tokens  # ttft/itl objectives
        self.slo_ns, self.slo_factor, self.min_samples = slo_ns, slo_factor, min_samples
        self.processes = processes  # serving groups and cgroups; None = each process alone, no cgroups
        self._culprits: dict[tuple[str, str, int], Culprits] = {}  # of the last due() batch
        self._splits = SplitCache()  # whole waits' split_wait(), kept while nothing they depend on changes
        # during one due(): (host, serving group) -> the span of its ready windows, and its waits' index
        self._windows: dict[tuple, tuple[int, int]] = {}
        self._indexes: dict[tuple, ColumnarIndex | WaitIndex | None] = {}
        self._batch: dict[tuple, list[tuple[int, int]]] = defaultdict(list)  # (host, group) -> its windows
        self._clipped: dict[tuple[int, int, int], tuple] = {}  # (id(wait), lo, hi) -> (wait, its part's split)
        # host -> (pid | cgroup | cpu, kind) -> evidence; requests look up their processes directly
        self._evidence: dict[str, HostEvidence] = defaultdict(lambda: defaultdict(SortedEvidence))
        self._newest: dict[str, int] = defaultdict(int)
        self._pending: list[RequestSpan] = []
        self._durations: dict[tuple[str, str], RollingMedian] = defaultdict(lambda: RollingMedian(baseline_window))
        # per (host, name): the self-contention of requests no one thread carried (causes.py)
        self._own_waits: dict[tuple[str, str], RollingMedian] = defaultdict(lambda: RollingMedian(baseline_window))
        self._attributed_until: dict[str, int] = {}
        self._events_per_host: dict[str, int] = defaultdict(int)
        self.max_events_per_host, self.max_pending = max_events_per_host, max_pending
        self.attributed = SpanKeys(REMEMBERED_KEYS)
        self.late_evidence = self.columnar_failures = 0  # evidence after its requests; columnar failures (a bug)
        self.evidence_evicted = 0  # kept out of the window by the count bound, not by age
        self.gpu = GpuEvents(horizon_ns)  # Xid errors and NVML slowdowns, per GPU (streams/gpu_events.py)
        self.clock = EvidenceClock()
        self.stacks = CulpritStacks()  # the waits that carry a stack, and the frames (for the OTLP export)

    def add_evidence(self, event: Evidence | GpuXid | GpuTelemetry) -> None:
        if isinstance(event, (GpuXid, GpuTelemetry)):  # a GPU's own reports: named, not charged
            self.gpu.add(event)
            return
        self.clock.saw([event])
        if isinstance(event, (CgroupThrottle, IrqTime)) and not (
                event.interval_ns and (event.throttled_ns if isinstance(event, CgroupThrottle) else event.time_ns)):
            return  # an interval with nothing to charge (or none at all): not worth its memory
        if isinstance(event, (CgroupThrottle, IrqTime)):
            since = throttled_span(event)[0] if isinstance(event, CgroupThrottle) else event.ts_ns - event.interval_ns
            self._splits.touched(event.host, since, event.ts_ns)
            if len(self._evidence[event.host][(index_of(event), type(event))].events) >= MAX_WAITS_PER_PROCESS:
                self._splits.forget(event.host)  # the add below drops the oldest tenth
        if event.ts_ns - duration_ns(event) < self._attributed_until.get(event.host, 0):
            self.late_evidence += 1  # some request it overlapped may already be out
        self._evidence[event.host][(index_of(event), type(event))].add(event)
        if type(event) is RunqEvent and event.suspect_stack:
            self.stacks.saw(event)
        self._events_per_host[event.host] += 1
        if event.ts_ns > self._newest[event.host] + self.horizon_ns // 10:
            # expire in steps of a tenth of the horizon, not on every event
            self._newest[event.host] = event.ts_ns
            self._expire(event.host, self._newest[event.host] - self.horizon_ns)
        if self._events_per_host[event.host] > self.max_events_per_host:
            self._shed(event.host)

    def add_evidence_many(self, records: list[Evidence]) -> None:
        """add_evidence of each record in turn, with the same result; a message's run-queue events (the bulk: 100k+ a
        second per worker) take an inlined loop with no per-event type dispatch."""
        if not records or type(records[0]) is not RunqEvent:
            for record in records:
                self.add_evidence(record)
            return
        self.clock.saw(records)
        evidence, until, newest, counts = self._evidence, self._attributed_until, self._newest, self._events_per_host
        step = self.horizon_ns // 10
        for event in records:
            if type(event) is not RunqEvent:
                self.add_evidence(event)
                continue
            host, ts, length = event.host, event.ts_ns, event.wait_ns
            if ts - length < until.get(host, 0):
                self.late_evidence += 1
            evidence[host][(event.pid, RunqEvent)].add(event, length)
            if event.suspect_stack:
                self.stacks.saw(event)
            counts[host] += 1
            if ts > newest[host] + step:
                newest[host] = ts
                self._expire(host, ts - self.horizon_ns)
            if counts[host] > self.max_events_per_host:
                self._shed(host)

    def remember(self, done: RequestAttribution) -> None:
        """Count an earlier attribution into the baseline (priming after a restart)."""
        self._durations[(done.host, done.name)].append(done.service_ns or done.duration_ns)
        self.attributed.add(done)

    def add_request(self, span: RequestSpan) -> None:
        if span not in self.attributed:
            self._pending.append(span)

    def forget_hosts(self, hosts: set[str]) -> None:
        """Drop all but the attributed spans of ``hosts``: their next owner rebuilds it (attribution_stage.py)."""
        self._pending = [s for s in self._pending if s.host not in hosts]
        books: tuple[dict, ...] = (self._evidence, self._newest, self._attributed_until, self._events_per_host,
                                   self._durations, self._own_waits)
        for book in books:
            for key in [k for k in book if (k[0] if isinstance(k, tuple) else k) in hosts]:
                del book[key]
        for host in hosts:
            self._splits.forget(host)
            self.clock.forget(host)
            self.stacks.forget(host)

    def _expire(self, host: str, before_ns: int) -> None:
        self._splits.forget(host)  # a split may have leant on expired throttling or interrupts
        self.stacks.expire(host, before_ns)
        processes = self._evidence[host]
        for key, evidence in list(processes.items()):
            evidence.expire(before_ns)
            if not evidence.events:
                del processes[key]
        self._events_per_host[host] = sum(len(e.events) for e in processes.values())

    def _shed(self, host: str) -> None:
        """Over the count bound (a storm): drop the oldest tenth of the host's evidence in one go, so memory stays
        bounded whatever the rate."""
        before = self._events_per_host[host]
        lists = [e.starts for e in self._evidence[host].values() if e.starts]
        self._expire(host, kth_smallest(lists, min(sum(map(len, lists)) - 1, before // 10)))
        self.evidence_evicted += before - self._events_per_host[host]

    @property
    def pending(self) -> int:
        return len(self._pending)

    def due(self, now_ns: int) -> list[RequestAttribution]:
        """Attribute every request whose span ended at least grace_ns ago, or whose evidence has all come."""
        # over its grace, or its host's evidence came past its end (evidence_clock.py)
        ready, waiting = list[RequestSpan](), list[RequestSpan]()
        for s in self._pending:
            (ready if s.end_ns + self.grace_ns <= now_ns or self.clock.past(s.host, s.end_ns) else waiting).append(s)
        if len(waiting) > self.max_pending:  # memory bound: the oldest go now, with what evidence there is
            waiting.sort(key=lambda s: s.end_ns)
            ready.extend(waiting[:len(waiting) - self.max_pending])
            waiting = waiting[len(waiting) - self.max_pending:]
        if not ready:
            return []
        self._pending, self._culprits = waiting, {}
        ready.sort(key=lambda s: s.end_ns)
        out = []
        for span in ready:
            key = _batch_key(span.host, self._group(span))
            lo, hi = self._windows.get(key, (span.start_ns, span.end_ns))
            self._windows[key] = (min(lo, span.start_ns), max(hi, span.end_ns))
            self._batch[key].append((span.start_ns, span.end_ns))
            self._batch[key] += windows_wanted(span, self._span_slo, self.tokens)  # its phases: the batch's index
        try:
            for span in ready:
                if span in self.attributed:  # the same span twice in the backlog
                    continue
                out.append(self.attribute(span))
                self.attributed.add(span)
                self._attributed_until[span.host] = max(self._attributed_until.get(span.host, 0), span.end_ns)
        finally:
            self._splits.end_batch()
            self._windows.clear()
            self._indexes.clear()
            self._batch.clear()
            self._clipped.clear()
        return out

    def baseline_ns(self, host: str, name: str) -> tuple[int, bool, int]:
        """Rolling median of this host's requests of this name, each less its carrying thread's waits but those behind
        its own group (``service_ns``: what it would have taken with no one else in the way); whether enough were seen
        to judge against it; and then their usual spread (causes.USUAL_QUANTILE over the median). Learning plain
        durations during a contention made the contention the normal: no excess left to explain."""
        samples = self._durations.get((host, name))
        if not samples:
            return 0, False, 0
        median, trusted = int(samples.median()), len(samples) >= self.min_samples
        return median, trusted, max(0, samples.quantile(USUAL_QUANTILE) - median) if trusted else 0

    def _slo(self, baseline: int, trusted: bool) -> int:
        """A request's SLO: the configured one, else slo_factor times its baseline once trusted (0: none yet)."""
        return self.slo_ns or (int(self.slo_factor * baseline) if trusted else 0)

    def _span_slo(self, span: RequestSpan) -> int:
        return self._slo(*self.baseline_ns(span.host, span.name)[:2])

    def _usual_own(self, span: RequestSpan, charged: Charges, waited: int) -> int:
        """The self-contention requests of this name that no one thread carried usually have (the median of the recent
        ones, before this one; 0 for a carried request, or before USUAL_AFTER were seen)."""
        if charged.carried:
            return 0
        seen = self._own_waits[(span.host, span.name)]
        usual = int(seen.median()) if len(seen) >= USUAL_AFTER else 0
        seen.append(self_contention_ns(charged, waited))
        return usual

    def culprits(self, done: RequestAttribution) -> Culprits:
        """The throttled cgroup and the interrupt source behind a request of
        the last due() batch (empty when none was charged)."""
        return self._culprits.get((done.host, done.boot_id, done.seq), Culprits())

    def attribute(self, span: RequestSpan) -> RequestAttribution:
        """The span's record key (host, boot_id, seq) is reused, so attributing
        the same span again replaces, not adds, its row."""
        duration = max(0, span.end_ns - span.start_ns)
        baseline, trusted, spread = self.baseline_ns(span.host, span.name)
        group = self._group(span)
        evidence = self._evidence.get(span.host, {})
        charged, budget, waited, routine = self._charges(evidence, span, group, duration - baseline)
        # one thread cannot wait twice at once, so its waits are a lower bound of the delay; other threads'
        # waits may be off the request's path. Its waits behind its own group stay in: routine where the group
        # has more busy threads than CPUs (a real vLLM on 2), learning them away named quiet requests self_contention.
        service = duration - min(duration, max(0, budget.delay_ns - routine))
        self._durations[(span.host, span.name)].append(service)
        if not baseline:
            baseline = service
        excess = max(0, duration - baseline)
        slo = self._slo(baseline, trusted)
        chain = wait_chain(evidence, group, (budget.pid, budget.tid), span.start_ns, span.end_ns) if (
            group and budget.tid and excess and budget.blocked.get("sleep", 0) >= MIN_SHARE * excess) else []
        cause, explained, causes = weigh(excess, baseline, waited, charged, budget,
                                         self._usual_own(span, charged, waited),
                                         spread if not slo or duration <= slo else 0, chained := chained_stalls(chain))
        culprit = self._culprit(evidence, span, group, cause, charged, budget) or (
            chain[-1].culprit if cause in chained else "")
        xid, throttle, gpu = self.gpu.during(span.host, self._gpus(span.host, group), span.start_ns, span.end_ns)
        if cause == "unexplained" and (xid or throttle):  # nothing on the CPU side explains it; its GPU says why
            cause, culprit = "gpu_xid" if xid else "gpu_throttle", gpu_culprit(xid, throttle, gpu)
        info = self._record(span.host, span.pid)
        runq, ioctl, longest_call = charged.runq, charged.ioctl, charged.longest_call
        broken = self.tokens.broken(span.model, span.ttft_ns, itl := inter_token_ns(span))  # phases: only these
        phases = [] if cause == "none" or not (broken or slo and duration > slo) else phase_parts(span, lambda lo, hi: (
            self._charges(evidence, replace(span, start_ns=lo, end_ns=hi), group, hi - lo)[:3]), partial(
            self._culprit, evidence, span, group))
        return RequestAttribution(
            host=span.host, boot_id=span.boot_id, seq=span.seq, ts_ns=span.end_ns, request_id=span.request_id,
            trace_id=span.trace_id, name=span.name, pid=span.pid, start_ns=span.start_ns, end_ns=span.end_ns,
            span_id=span.span_id, duration_ns=duration, baseline_ns=baseline, model=span.model, ttft_ns=span.ttft_ns,
            excess_ns=excess, status=span.status, runq_wait_ns=runq[0], runq_wait_max_ns=runq[1],
            runq_waits=runq[2], suspects=charged.suspects, cause=cause, explained=round(explained, 4),
            slo_ns=slo, slo_breached=bool(slo) and duration > slo,
            gpu_ioctl_ns=ioctl[0], gpu_ioctl_max_ns=ioctl[1], gpu_ioctls=ioctl[2],
            throttled_ns=charged.throttled, irq_ns=charged.irq, pids=sorted(charged.contributed),
            pod=info.pod if info else "", namespace=info.namespace if info else "",
            container=info.container if info else "", self_wait_ns=charged.own_ns,
            self_threads=len(charged.own_threads), itl_ns=itl, token_slo_breached=broken,
            service_ns=service, gpu_ioctl_call=ioctl_name(longest_call.request) if longest_call else "",
            thread_tid=budget.tid, gil_wait_ns=budget.blocked.get("gil", 0),
            memory_wait_ns=budget.blocked.get("memory", 0), io_wait_ns=budget.blocked.get("io", 0),
            sleep_ns=budget.blocked.get("sleep", 0), on_cpu_ns=budget.on_cpu_ns(duration), culprit=culprit,
            gpu_xid=xid.xid if xid else 0, gpu_throttle=throttle, chain=chain if cause != "none" else [],
            causes=[CauseShare(cause=name, share=round(share, 4)) for name, share in causes], phases=phases,
            culprit_stack=self.stacks.culprit_stack(span, group, culprit) if cause == "runq_starvation" else 0)

    def _group(self, span: RequestSpan) -> set[int] | None:
        """The processes whose evidence counts for the span (None: every process of the host)."""
        return (self.processes.serving_group(span.host, span.pid) if self.processes and span.pid
                else {span.pid} if span.pid else None)

    def _charges(self, evidence: HostEvidence, span: RequestSpan, group: set[int] | None,
                 excess: int) -> tuple[Charges, ThreadBudget, int, int]:
        """A request's charges, its carrying thread's budget, how long any of its group's threads waited, and how long
        its carrying thread waited behind the group's own threads: from the due() batch's index
        (streams/wait_index.py) where it answers, else by walking the parts."""
        index, fast = self._index(evidence, span, group), None  # fast: the index's Charged
        while index is not None:
            try:
                per_thread, fast = index.charges(span.start_ns, span.end_ns,
                                                 lambda event, lo, hi: self._part_split(evidence, event, lo, hi))
                break
            except Tie:  # the row-wise index breaks the columns' ties as the walk does; its own, the walk
                index = self._index(evidence, span, group, True) if isinstance(index, ColumnarIndex) else None
        runq = [] if index else thread_parts(evidence, span.start_ns, span.end_ns, RunqEvent, group)
        parts: dict[type, list[Part]] = {
            RunqEvent: runq, GpuIoctl: thread_parts(evidence, span.start_ns, span.end_ns, GpuIoctl, group)}
        contributed: set[int] = set()
        budget = thread_budget(evidence, span, group, per_thread if index else runq_per_thread(runq), contributed)
        charged_by_one = budget.named and budget.busy() and budget.delay_ns >= DOMINANT_SHARE * excess
        if charged_by_one:
            # The span names its thread, that thread was not mostly asleep waiting on others, and its
            # own waits and stalls would explain the excess (else the request waited mostly on other
            # threads of the group: vLLM's front end asleep while its throttled engine works): its
            # own waits are the request's delay (carried_parts).
            if index:  # only those threads' parts are needed
                parts[RunqEvent] = index.parts(span.start_ns, span.end_ns, {budget.tid} | budget.gil_holders)
                index = None
            parts = carried_parts(parts, budget)
        if index and fast is not None:
            contributed |= fast.pids
            charged = Charges(**{f.name: getattr(fast, f.name) for f in fields(fast) if f.name != "pids"})
            waited = index.union_ns(span.start_ns, span.end_ns)
        else:
            charged = self._charge(evidence, parts[RunqEvent], group, contributed)
            waited = union_ns(parts[RunqEvent])
        charged.ioctl, charged.longest_call = add_calls(parts[GpuIoctl], contributed)
        charged.carried = charged_by_one
        charged.contributed = contributed
        # the carrying thread's parts are whole in the walked (or carried) parts; the index is asked
        # for them only where it answered for the whole group
        if budget.tid and group and isinstance(index, ColumnarIndex) and not budget.gil_holders:
            routine = index.behind(span.start_ns, span.end_ns, budget.tid)  # and none behind GIL holders
        else:
            routine, charged.behind_gil_holders = behind_own_ns(
                index.parts(span.start_ns, span.end_ns, {budget.tid}) if index else parts[RunqEvent], budget,
                group) if budget.tid and group else (0, 0)
        # a wait throttled or taken by interrupts is not routine, whoever held the CPU before
        return charged, budget, waited, max(0, routine - charged.throttled - charged.irq)

    def _index(self, evidence: HostEvidence, span: RequestSpan, group: set[int] | None,
               row_wise: bool = False) -> ColumnarIndex | WaitIndex | None:
        """The index of the span's group's waits over its due() batch (built once a batch, columnar where it can:
        streams/wait_columns.py, else or where ``row_wise`` streams/wait_index.py); None outside due() or where the
        walk must answer."""
        key = _batch_key(span.host, group)
        if key not in self._windows or span.end_ns <= span.start_ns:
            return None
        if (key, row_wise) not in self._indexes:
            lo, hi = self._windows[key]
            try:
                index = None if row_wise else ColumnarIndex.build(evidence, group, lo, hi, self._batch[key],
                                                                  lambda pid: self._record(span.host, pid))
            except Exception:  # a bug there costs speed, never the batch's requests: the walk's index answers
                self.columnar_failures, index = self.columnar_failures + 1, None
            if index is not None:
                index.parts_split = self._clipped  # the splits of the parts it hands a carried request's walk
            self._indexes[(key, row_wise)] = index or WaitIndex.build(evidence, group, lo, hi, self._whole_splits)
        return self._indexes[(key, row_wise)]

    def _part_split(self, evidence: HostEvidence, event: RunqEvent, lo: int, hi: int, whole: bool = False) -> tuple:
        """split_wait() of a part of a wait: from the batch's splits where its index split it."""
        found = self._clipped.get((id(event), lo, hi))
        if found is not None and found[0] is event:
            return found[1]() if callable(found[1]) else found[1]
        return self._whole_split(event) if whole else split_wait(evidence, self._record(event.host, event.pid), event,
                                                                 lo, hi)

    def _whole_splits(self, events: list[RunqEvent]) -> list[tuple]:
        """_whole_split() of many waits of one host: those not kept split together (streams/split_columns.py)."""
        records = [self._record(event.host, event.pid) for event in events]
        return self._splits.get_many(events, records, lambda missing: split_many(
            self._evidence.get(events[0].host, {}), [records[k] for k in missing], [events[k] for k in missing],
            [events[k].ts_ns - events[k].wait_ns for k in missing], [events[k].ts_ns for k in missing]))

    def _whole_split(self, event: RunqEvent) -> tuple:
        """split_wait() of a whole wait, once while what it depends on stays (SplitCache): the requests served
        together (continuous batching) overlap the same waits, and each asks, batch after batch."""
        record = self._record(event.host, event.pid)
        return self._splits.get(event, record, lambda: split_wait(
            self._evidence.get(event.host, {}), record, event, event.ts_ns - event.wait_ns, event.ts_ns))

    def _charge(self, evidence: HostEvidence, parts: list[Part], group: set[int] | None,
                contributed: set[int]) -> Charges:
        """A request's run-queue parts added up, each split by what kept the CPU away (split_wait): throttling,
        interrupts, and of the rest the group's own threads (self-contention) or else the suspects."""
        # Suspects are grouped by command name: a job of many processes (a
        # backup with workers, a pool of hogs) is one suspect to move; its pid
        # is the process that held the CPU longest.
        by_suspect: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        throttled = irq = own_ns = idle_ns = total = longest = count = 0
        throttles: dict[str, int] = defaultdict(int)
        sources: dict[tuple[int, str, str], int] = defaultdict(int)
        irq_records: dict[tuple[int, str, str], IrqTime] = {}
        own_threads: set[int] = set()
        for event, lo, hi, whole in parts:
            part = hi - lo
            total += part
            if part > longest:
                longest = part
            count += 1
            contributed.add(event.pid)
            split = self._part_split(evidence, event, lo, hi, whole)
            cut, cgroup, shares, stolen = split
            throttles[cgroup] += cut
            for key, ns, record in shares:
                sources[key] += ns
                irq_records[key] = record
            throttled += cut
            irq += stolen
            rest = part - cut - stolen
            if rest <= 0:
                continue
            if group is not None and event.suspect_pid in group:
                own_ns += rest
                own_threads.add(event.suspect_tid)
            elif event.suspect_pid == 0:
                idle_ns += rest
            else:
                by_suspect[event.suspect_comm][event.suspect_pid] += rest
        return Charges(runq=(total, longest, count), suspects=rank_suspects(by_suspect, TOP_SUSPECTS),
                        throttled=throttled, throttles=throttles, irq=irq, sources=sources, irq_records=irq_records,
                        own_ns=own_ns, own_threads=own_threads, idle_ns=idle_ns)

    def _culprit(self, evidence: HostEvidence, span: RequestSpan, group: set[int] | None, cause: str,
                 charged: Charges, budget: ThreadBudget) -> str:
        """Whom or what the cause names: the top suspect, the throttled cgroup, the interrupt source, the longest GPU
        driver call, the evictor, the device of its I/O, else who woke it from its stalls most. Keeps the records
        behind the throttling and interrupt charges for culprits()."""
        if cause == "io_wait":  # the device: what woke it was whatever ran where the I/O completed
            return budget.device()
        key = (span.host, span.boot_id, span.seq)
        if charged.throttled or charged.irq:
            throttles, sources = charged.throttles, charged.sources
            self._culprits[key] = Culprits(
                throttle=latest_throttle(evidence, max(throttles, key=throttles.__getitem__), span.end_ns)
                if charged.throttled else None,
                irq=charged.irq_records[max(sources, key=sources.__getitem__)] if charged.irq else None)
        found = self._culprits.get(key, Culprits())
        suspects, longest_call = charged.suspects, charged.longest_call
        return {"runq_starvation": suspects[0].comm if suspects else "",
                "cfs_throttling": found.throttle.cgroup if found.throttle else "",
                "irq": found.irq.source if found.irq else "", "steal": "hypervisor",
                "gpu_ioctl_stall": ioctl_name(longest_call.request) if longest_call else "",
                "memory_stall": cause == "memory_stall"  # looked for only then: a 60 s look back
                and evictor(evidence, span, group, lambda pid: self._record(span.host, pid)),
                }.get(cause) or budget.wakers.get(kind_of(cause), "")

    def _gpus(self, host: str, group: set[int] | None) -> set[str] | None:
        """The GPUs the request's processes hold open; None (any of the
        host's) where no process record names one."""
        if self.processes is None or group is None:
            return None
        found = {gpu for pid in group if (info := self._record(host, pid)) for gpu in info.gpus}
        return found or None

    def _record(self, host: str, pid: int) -> ProcessInfo | None:
        """The process's record, or None where none has come (yet)."""
        return self.processes.processes.get((host, pid)) if self.processes else None


def _batch_key(host: str, group: set[int] | None) -> tuple[str, frozenset[int] | None]:
    """What a due() batch indexes waits by: the host and the serving group."""
    return host, None if group is None else frozenset(group)
