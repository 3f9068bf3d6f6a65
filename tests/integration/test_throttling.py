# SPDX-License-Identifier: Apache-2.0
"""CFS throttling end to end on this kernel (cgroup v1: /sys/fs/cgroup/cpu):
a CPU-bound victim in a cgroup with a quota of 0.2 CPUs, on the CPU tests keep free.
Its run-queue waits (preempted when the quota runs out, run again at the
next period) must come out as cfs_throttling, not as starvation by whatever
ran next; the same victim without a quota raises nothing. The IRQ probe runs
in the same pipeline, and its records reach the store too.

The victim also joins a same-named cgroup in the v2 (unified) part of the
hybrid layout, as systemd and the kubelet place a unit's or container's
processes in every hierarchy: a process record's cgroup is its v2 path."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from jitterscope.broker import free_port
from jitterscope.workload import last_cpu
from tests.conftest import late_evidence, remove_cgroup, wait_until

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

V1 = Path("/sys/fs/cgroup/cpu")
UNIFIED = Path("/sys/fs/cgroup/unified")
STANDIN = Path(__file__).resolve().parents[2] / "examples/inference_standin.py"
COMM = "jsthrottled"
MS = 1_000_000
SECOND = 1_000_000_000

# Joins the cgroups given, prints its pid, spins lightly (10% of a CPU, under
# the quota: the collector learns the cgroup without throttling it) until a
# line comes on stdin, then spins flat out for argv[1] seconds.
_VICTIM = f"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, {COMM!r}.encode(), 0, 0, 0)
for procs in sys.argv[2:]:
    open(procs, "w").write(str(os.getpid()))
print(os.getpid(), flush=True)
os.set_blocking(0, False)
while not sys.stdin.readline():
    end = time.monotonic() + 0.001
    while time.monotonic() < end:
        pass
    time.sleep(0.009)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
"""


@contextmanager
def cgroup(quota_us: int | None):
    """A fresh cgroup ("/jitterscope-test-<uuid>") with that quota per 100 ms
    (None: no limit), in the cpu hierarchy and, where mounted, the v2 one;
    yields (path, the cgroup.procs files to join). Removed at the end."""
    name = f"jitterscope-test-{uuid.uuid4().hex[:12]}"
    dirs = [V1 / name] + ([UNIFIED / name] if (UNIFIED / "cgroup.procs").exists() else [])
    for d in dirs:
        d.mkdir()
    try:
        (dirs[0] / "cpu.cfs_period_us").write_text("100000")
        (dirs[0] / "cpu.cfs_quota_us").write_text(str(quota_us if quota_us else -1))
        yield "/" + name, [str(d / "cgroup.procs") for d in dirs]
    finally:
        for d in dirs:
            remove_cgroup(d)


@contextmanager
def victim(procs: list[str], seconds: float):
    popen = subprocess.Popen(["taskset", "-c", str(last_cpu()), sys.executable, "-c", _VICTIM, str(seconds), *procs],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        int(popen.stdout.readline())
        yield popen
    finally:
        popen.kill()
        popen.wait()


@pytest.fixture(scope="module")
def pipeline(stack):
    otlp_port = free_port()
    # a grace long enough for throttling records from a collector slowed by a loaded 2-CPU test host
    # (5 s was not: in a fresh run of the suite 33 of 75 throttled requests came out with no throttled
    # time; alone, 75 of 75 had it)
    worker = stack.start_worker_with(JITTERSCOPE_ATTRIBUTION_GRACE_S="15", JITTERSCOPE_REQUEST_SLO_MS="30")
    collector = stack.start_collector(
        JITTERSCOPE_TARGET_COMMS=f'["{COMM}"]', JITTERSCOPE_TARGET_RESCAN_S="1",
        JITTERSCOPE_OTLP_PORT=str(otlp_port), JITTERSCOPE_IRQ_MIN_SHARE="0")
    yield stack, worker, collector, otlp_port


def throttling(stack, path: str):
    return stack.query(
        "SELECT count(), sum(nr_periods), sum(nr_throttled), sum(throttled_ns), any(quota_us), any(period_us) "
        "FROM jitterscope.cgroup_throttle FINAL WHERE cgroup = {cg:String}", cg=path)[0]


def alerts(stack, pid: int) -> list:
    return stack.query("SELECT kind, suspect_pid, summary, remedy FROM jitterscope.alerts WHERE pid = {pid:UInt32} "
                       "ORDER BY ts", pid=pid)


def why_blamed(stack, path: str, pid: int) -> list:
    """For a failure message: each runq_starvation alert of ``pid`` naming
    the idle task, with how long after the wait it was raised, the
    throttling records of ``path`` around the wait, and the worker's count
    of parked waits judged late (by why)."""
    blamed = stack.query(
        "SELECT toUnixTimestamp64Nano(ts), wait_ns, toUnixTimestamp64Nano(raised) FROM jitterscope.alerts "
        "WHERE pid = {pid:UInt32} AND kind = 'runq_starvation' AND suspect_pid = 0", pid=pid)
    out = []
    for end, wait, raised in blamed:
        records = stack.query(
            "SELECT toUnixTimestamp64Nano(ts) - {end:Int64}, interval_ns, nr_periods, nr_throttled, throttled_ns "
            "FROM jitterscope.cgroup_throttle FINAL WHERE cgroup = {cg:String} AND ts > fromUnixTimestamp64Nano("
            "{lo:Int64}) AND ts < fromUnixTimestamp64Nano({hi:Int64}) ORDER BY ts",
            end=end, cg=path, lo=end - wait - SECOND, hi=end + SECOND)
        out.append({"wait_ms": wait / MS, "raised_after_ms": (raised - end) / MS,
                    "records (ts - wait end, interval, periods, throttled, ns)": records})
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.web_port}/metrics", timeout=10).read().decode()
    return out + [line for line in text.splitlines() if line.startswith("jitterscope_streams_runq_judged_late")]


def caught_up(stack, worker, since_ns: int) -> None:
    """Everything the collector published up to ``since_ns`` is judged and
    stored: IRQ records (every 250 ms, the timer tick always makes some)
    from later than that are in the store."""
    wait_until(lambda: stack.query(
        "SELECT count() FROM jitterscope.irq_time WHERE ts > fromUnixTimestamp64Nano({t:Int64})",
        t=since_ns + 1_000_000_000)[0][0], 60, "the pipeline to catch up", worker)


def test_a_throttled_victim_is_cfs_throttling_not_a_neighbour(pipeline):
    stack, worker, collector, _ = pipeline
    with cgroup(20_000) as (path, procs), victim(procs, 4) as v:
        wait_until(lambda: throttling(stack, path)[1], 60, "the quota cgroup sampled", worker)
        v.stdin.write("go\n")
        v.stdin.flush()
        v.wait(60)
        ended = time.time_ns()
        count, periods, throttled, throttled_ns, quota, period = wait_until(
            lambda: (row := throttling(stack, path))[2] >= 5 and row, 60, "throttled periods stored", worker)
        caught_up(stack, worker, ended)
    assert (quota, period) == (20_000, 100_000)
    # 4 s at 0.2 CPUs: ~40 periods, each throttled for most of its 100 ms
    # when the victim has its CPU to itself (fewer when other tests crowd it)
    assert throttled >= 5 and throttled_ns >= 100 * MS, (periods, throttled, throttled_ns)
    waits = stack.query("SELECT count() FROM jitterscope.runq_events FINAL WHERE pid = {pid:UInt32} "
                        "AND wait_ns >= 10000000", pid=v.pid)[0][0]
    assert waits >= 5, "the throttled victim's long run-queue waits reached the rules"
    raised = alerts(stack, v.pid)
    kinds = [a[0] for a in raised]
    assert "cfs_throttling" in kinds, raised
    # Alone on its CPU, the task that ran next after a throttled wait is the
    # idle task: such a wait must never be blamed on it. (On a shared
    # machine another test's hogs may really crowd the CPU as well; waits
    # they cause are rightly runq_starvation naming them.)
    blamed_idle = [a for a in raised if a[0] == "runq_starvation" and a[1] == 0]
    assert blamed_idle == [], (blamed_idle, why_blamed(stack, path, v.pid))
    print(f"\n[measured] throttled victim: {throttled} of {periods} periods throttled, "
          f"{throttled_ns / MS:.0f} ms; {waits} waits >= 10 ms; alerts {sorted(set(kinds))}")
    kind, suspect, summary, remedy = next(a for a in raised if a[0] == "cfs_throttling")
    assert path in summary and "0.2 CPUs" in summary and suspect == 0
    assert "raise the CPU limit" in remedy and "static CPU manager policy" in remedy
    irq = stack.query("SELECT count(), sum(time_ns) FROM jitterscope.irq_time")[0]
    assert irq[0] > 0 and irq[1] > 0, "IRQ time records reach the store"


def test_the_same_victim_without_a_quota_raises_no_throttling(pipeline):
    stack, worker, collector, _ = pipeline
    with cgroup(None) as (path, procs), victim(procs, 3) as v:
        time.sleep(2)  # a target at the collector's next rescan (1 s)
        v.stdin.write("go\n")
        v.stdin.flush()
        v.wait(60)
        caught_up(stack, worker, time.time_ns())
    assert throttling(stack, path)[0] == 0, "no quota: no records"
    assert [a for a in alerts(stack, v.pid) if a[0] == "cfs_throttling"] == []


def the_plan_lifts_the_limit_and_puts_it_back(stack, path: str) -> str:
    """Issue 35: `jitterscope fix` offers the throttled serving group's CPU limit lifted, with its gain from the
    stored attributions; --apply lifts it (journaled), --undo puts the quota back as it was."""
    env = {**stack.env, "JITTERSCOPE_DATA_DIR": str(stack.data_dir)}
    quota = V1 / path.lstrip("/") / "cpu.cfs_quota_us"
    before = quota.read_text().strip()

    def fix(*args: str) -> str:
        deadline = time.monotonic() + 60  # the store, busy storing, may not answer at once
        while (done := subprocess.run([sys.executable, "-m", "jitterscope.cli", "fix", *args], env=env,
                                      capture_output=True, text=True, timeout=120)).returncode != 0 \
                and time.monotonic() < deadline:
            time.sleep(2)
        assert done.returncode == 0, f"fix {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    plan = json.loads(fix("--since", "10m", "-f", "json"))
    lift = next((a for a in plan["actions"] if a["key"] == f"lift:{path}"), None)
    assert lift and lift["gain_p99_ms"] > 0 and lift["command"] == f"echo -1 > {quota}", plan
    applied = fix("--apply", lift["key"])
    assert quota.read_text().strip() == "-1", applied
    undone = fix("--undo")
    assert quota.read_text().strip() == before, undone
    return f"{lift['key']} P99 -{lift['gain_p99_ms']} ms, applied and undone ({before} again)"


def test_requests_of_a_standin_are_attributed_to_cfs_throttling_once_it_has_a_quota(pipeline):
    """The stand-in runs unlimited first (its requests set the baseline and
    must not be charged to throttling), then its cgroup gets a quota of 0.1
    CPUs: it wants ~0.67 (10 ms of CPU every 15 ms), so about one request
    per 100 ms period runs and the next waits for the period to end; those
    slow requests are cfs_throttling."""
    stack, worker, collector, otlp_port = pipeline
    with cgroup(None) as (path, procs):
        join = "; ".join(f"echo $$ > {p}" for p in procs)
        standin = subprocess.Popen(
            ["sh", "-c", f'{join}; exec "$@"', "sh", sys.executable, str(STANDIN), "--endpoint",
             f"http://127.0.0.1:{otlp_port}/v1/traces", "--pin-cpu", str(last_cpu()), "--requests", "200",
             "--cpu-ms", "10", "--gap-ms", "5", "--id-prefix", "thr-", "--times"], stdout=subprocess.PIPE, text=True)
        lines, limited_at = [], 0
        for line in standin.stdout:
            lines.append(line.split())
            if len(lines) == 120:
                (V1 / path.lstrip("/") / "cpu.cfs_quota_us").write_text("10000")
                limited_at = time.time_ns()
        assert standin.wait(120) == 0 and len(lines) == 200
        wait_until(lambda: stack.query("SELECT count() FROM jitterscope.request_attribution FINAL "
                                       "WHERE request_id = {id:String}", id=lines[-1][0])[0][0], 60,
                   "the last request attributed", worker)
        lifted = the_plan_lifts_the_limit_and_puts_it_back(stack, path)
    rows = {r[0]: r[1:] for r in stack.query(
        "SELECT request_id, cause, excess_ns, throttled_ns, explained FROM jitterscope.request_attribution FINAL "
        "WHERE startsWith(request_id, 'thr-')")}
    before = [rows[rid] for rid, _, end in lines if int(end) < limited_at]
    # from the next samples of the cgroup on (cfs_interval_s, and a rescan)
    after = [rows[rid] for rid, start, _ in lines if int(start) > limited_at + 500 * MS]
    slow = [r for r in after if r[1] >= 40 * MS]
    throttled = [r for r in slow if r[0] == "cfs_throttling" and r[2] > 0]
    print(f"\n[measured] stand-in with a quota: {len(throttled)}/{len(slow)} slow requests cfs_throttling "
          f"(other causes {sorted({r[0] for r in slow} - {'cfs_throttling'})}); unlimited: "
          f"{sum(r[0] == 'cfs_throttling' for r in before)}/{len(before)} cfs_throttling; explained >= 0.9 for "
          f"{sum(r[3] >= 0.9 for r in slow)} of the slow (median {statistics.median(r[3] for r in slow or [(0,) * 4]):.2f})"
          f"; fix: {lifted}")
    assert len(before) >= 100
    # the first throttled interval began before the quota did, and its time is
    # spread over all of it: only requests in that interval may be charged (and,
    # where the charge is most of a small excess, named: one of 120 was, in CI)
    early = [rows[rid] for rid, _, end in lines if int(end) < limited_at - SECOND // 2]
    assert len(early) >= 40 and not [r for r in early if r[2] or r[0] == "cfs_throttling"], early
    # Slow requests are charged throttled time (all of them when the
    # stand-in has its CPU to itself: 57 of 58 measured). Whether throttling
    # is the named cause depends on what else ran on the CPU meanwhile:
    # alone, the idle task ran and the whole wait is throttling; when other
    # tests' processes fill the throttled time, the attribution spreads the
    # cgroup's throttled time evenly over its interval and some requests
    # come out runq_starvation. The most common cause is still throttling.
    charged = [r for r in slow if r[2] > 0]
    causes = [r[0] for r in slow]
    assert len(slow) >= 10 and len(charged) >= 0.7 * len(slow), (f"late evidence: {late_evidence(stack)}", slow)
    assert max(set(causes), key=causes.count) == "cfs_throttling", causes
