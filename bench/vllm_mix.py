# SPDX-License-Identifier: Apache-2.0
"""A vLLM-shaped host for `bench/run.py attribution-mix` (bench/mix.py):
an API server process with a handful of threads (its event loop names
itself in the spans, as OpenTelemetry's ``thread.id`` does) and an
EngineCore process of tens of threads serving with it, hundreds of requests
a second of varied lengths (no two windows alike: they start and end
anywhere in a tick), beside the samplers' interrupt and throttling records.
The counterpart of mix.Mix's 1,024-thread extreme: what one real serving
host sends, tick by tick (mix.TICK_S each).
"""

from __future__ import annotations

from collections import Counter

from jitterscope.schemas import events, topics

API, ENGINE = 1000, 1001  # pids: the API server and its EngineCore
API_THREADS, ENGINE_THREADS = 4, 40
SPANS_PER_S = 300
SLOTS = 4  # a thread waits at most once in each of a tick's SLOTS slots: its waits never overlap
SUSPECTS = [(300 + i, f"job{i}") for i in range(5)]
MS = 1_000_000


def threads() -> list[tuple[int, int]]:
    """(pid, tid) of every serving thread; the API server's first is its event loop."""
    return ([(API, API * 100 + i) for i in range(API_THREADS)]
            + [(ENGINE, ENGINE * 100 + i) for i in range(ENGINE_THREADS)])


def setup_records(host: str, now: int) -> list[tuple[str, list[events.Record]]]:
    """Topology and processes: the serving pair in one cgroup, the suspects in batch pods."""
    cpus = list(range(64))
    topo = events.Topology(host=host, boot_id="vllm", seq=0, ts_ns=now, cpus=cpus, numa_nodes=[])
    procs = [events.ProcessInfo(host=host, boot_id="vllm", seq=1, ts_ns=now, pid=API, comm="vllm", ppid=1,
                                cmdline="vllm serve", cgroup="/kubepods/serving/vllm", cpus_allowed=cpus[:32]),
             events.ProcessInfo(host=host, boot_id="vllm", seq=2, ts_ns=now, pid=ENGINE, comm="VLLM::EngineCore",
                                cmdline="vllm serve", cgroup="/kubepods/serving/vllm", cpus_allowed=cpus[:32],
                                serving_group=API, ppid=API)]
    procs += [events.ProcessInfo(host=host, boot_id="vllm", seq=10 + i, ts_ns=now, pid=pid, comm=comm,
                                 cmdline=comm, cgroup=f"/kubepods/batch{i}", cpus_allowed=cpus)
              for i, (pid, comm) in enumerate(SUSPECTS)]
    return [(topics.TOPOLOGY, [topo]), (topics.PROCESSES, procs)]


class VllmMix:
    """The records one vLLM host sends, tick by tick (``tick_s`` each)."""

    def __init__(self, host: str, tick_s: float = 0.05, phases: bool = False):
        self.host, self.tick_s = host, tick_s
        self.phases = phases  # spans carry vLLM's gen_ai.latency phases, as a real vLLM's do
        self.seq = Counter()
        self.carry = 0.0

    def _next(self, kind: str) -> int:
        self.seq[kind] += 1
        return self.seq[kind]

    def _runq(self, ts: int) -> list[events.RunqEvent]:
        slot = int(self.tick_s * 1e9) // SLOTS
        out = []
        for n, (pid, tid) in enumerate(threads()):
            for k in range(SLOTS):
                s = self._next("runq")
                if s % 3 == 0:  # two slots in three: ~3,500 waits a second over the 44 threads
                    continue
                length = (1 + s * 7 % 9) * MS + s % 997 * 1000 if pid == ENGINE else (1 + s % 3) * MS
                end = ts - k * slot - (s * 31 % 5) * MS
                sp, sc = SUSPECTS[(s + n) % len(SUSPECTS)]
                if s % 11 == 0:  # the engine's own threads hold the CPU now and then (self-contention)
                    sp, sc = ENGINE, "VLLM::EngineCore"
                out.append(events.RunqEvent(host=self.host, boot_id="vllm", seq=s, ts_ns=end, pid=pid, tid=tid,
                                            comm="vllm", cpu=(tid + k) % 32, wait_ns=min(length, slot - 5 * MS),
                                            suspect_pid=sp, suspect_tid=sp * 10 + s % 4, suspect_comm=sc))
        return out

    def _spans(self, ts: int) -> list[events.RequestSpan]:
        self.carry += SPANS_PER_S * self.tick_s
        count, self.carry = int(self.carry), self.carry % 1
        out = []
        for _ in range(count):
            s = self._next("spans")
            took = (1_500 if s % 97 == 0 else 20 + s * 7919 % 480) * MS + s * 104_729 % MS
            end = ts - s * 13 % 40 * MS - s % 1000 * 1000  # anywhere in the tick: no two windows alike
            # vLLM's phases: a front end of 5%, queue 10%, prefill 20%, decode 60%, output the rest
            phases = dict(queue_ns=took // 10, prefill_ns=took // 5, decode_ns=took * 3 // 5,
                          ttft_ns=took * 7 // 20) if self.phases else {}
            out.append(events.RequestSpan(host=self.host, boot_id="vllm", seq=s, ts_ns=end, request_id=f"r{s}",
                                          trace_id="ab" * 16, span_id="cd" * 8, name="llm_request", pid=API,
                                          tid=API * 100 if s % 2 else 0, start_ns=end - took, end_ns=end,
                                          status="ok", **phases))
        return out

    def tick(self, tick: int, ts: int) -> list[tuple[str, list[events.Record]]]:
        out = [(topics.RUNQ, self._runq(ts))]
        spans = self._spans(ts)
        if spans:
            out.append((topics.REQUESTS, spans))
        if tick % max(1, round(0.25 / self.tick_s)) == 0:  # the samplers' 0.25 s bursts
            out.append((topics.IRQ, [events.IrqTime(
                host=self.host, boot_id="vllm", seq=self._next("irq"), ts_ns=ts, cpu=i // 2, interval_ns=250 * MS,
                kind="softirq" if i % 2 else "hardirq", source="NET_RX" if i % 2 else "nvme0q1", count=100,
                time_ns=(i % 7) * 100_000) for i in range(64)]))
            out.append((topics.CGROUP_THROTTLE, [events.CgroupThrottle(
                host=self.host, boot_id="vllm", seq=self._next("cfs"), ts_ns=ts, cgroup=cgroup, interval_ns=250 * MS,
                quota_us=200_000, period_us=100_000, nr_periods=2, nr_throttled=1, throttled_ns=3 * MS)
                for cgroup in ("/kubepods/batch0", "/kubepods/serving/vllm")]))
        return out


def bench_phase_cost(rounds: int = 3, seconds: float = 10.0) -> str:
    """What per-phase answers cost attribution (streams/phases.py): the
    vLLM shape with its spans carrying vLLM's phases, against the same spans
    without them, this tree, alternating in one process; asserts that
    phases change nothing but the phases."""
    import statistics

    from msgspec.structs import replace

    import mix
    from jitterscope.streams import attribution

    took: dict[bool, list[float]] = {False: [], True: []}
    got: dict[bool, list] = {}
    for r in range(rounds):
        for phased in ((False, True) if r % 2 == 0 else (True, False)):
            spent, got[phased] = mix._attribute_mix(attribution, seconds, "vllm", phases=phased)
            took[phased].append(spent)
    plain, with_phases = got[False], sum(bool(a.phases) for a in got[True])
    # what the phased spans add are the phases and the TTFT: every other field must agree
    assert [replace(a, phases=[], ttft_ns=0) for a in got[True]] == plain, "phases changed more than the phases"
    us = {k: [t / len(plain) * 1e6 for t in v] for k, v in took.items()}
    ratio = statistics.median(took[True]) / statistics.median(took[False])
    return (f"| attribute the vLLM-shaped host, its spans with vLLM's phases ({with_phases:,} of {len(plain):,} "
            f"requests with a cause get per-phase answers): {seconds:.0f} s, median of {rounds} alternating rounds | "
            f"{mix._spread(us[True], '{:,.0f}')} us a request | the same spans without phases: "
            f"{mix._spread(us[False], '{:,.0f}')} us a request | {ratio:.2f}x the cost |")
