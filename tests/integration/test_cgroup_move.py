# SPDX-License-Identifier: Apache-2.0
"""A serving process moved into a quota cgroup after the collector first
described it, as ``systemctl set-property``, ``cgclassify`` or a supervisor
would (issue "Never an innocent neighbour"), on this kernel (cgroup v1:
/sys/fs/cgroup/cpu).

The stand-in starts in a cgroup without a quota (the root, or the test's own
cgroup of maximal weight, which keeps other tests' CPU hogs on a shared
machine from starving it: see tests/conftest.py) and serves a first batch of
requests: the collector learns it (its process record names that cgroup).
The quota cgroup is created below it. The test then holds
it (SIGSTOP), moves every one of its threads into a cgroup with a quota of
0.1 CPUs (each tid written to ``tasks``, as cgclassify does) and lets it go
on at once. It wants ~0.67 CPUs (10 ms of CPU every 15 ms), so its requests
now wait for the next 100 ms period: they must come out cfs_throttling, not
runq_starvation by whatever else ran on the CPU, and the stored process
record must name the quota cgroup."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from jitterscope.broker import free_port
from jitterscope.workload import last_cpu
from tests.conftest import remove_cgroup, wait_until

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

V1 = Path("/sys/fs/cgroup/cpu")
STANDIN = Path(__file__).resolve().parents[2] / "examples/inference_standin.py"
MS = 1_000_000
SECOND = 1_000_000_000
SLO_MS = 30  # unthrottled requests take ~10-15 ms; throttled ones wait for the next 100 ms period
BEFORE, AFTER = 100, 80  # requests before and after the move (the baseline, a median, stays the first's)
CFS_INTERVAL_S = 0.25  # the cfs sampler's default: its first record after the move covers this much


def cpu_stat(group: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (group / "cpu.stat").read_text().splitlines())}


def tids(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def thread_cgroups(pid: int) -> set[str]:
    """The cpu cgroup of each of the process's threads (cgroup v1 places threads one by one)."""
    out = set()
    for tid in tids(pid):
        for line in Path(f"/proc/{pid}/task/{tid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                out.add(path)
    return out


def move_threads(pid: int, group: Path, path: str) -> None:
    """cgclassify's way: every thread's id into the cgroup's ``tasks``."""
    for _ in range(10):  # a thread started meanwhile
        for tid in tids(pid):
            try:
                (group / "tasks").write_text(str(tid))
            except ProcessLookupError:
                pass  # exited meanwhile
        if thread_cgroups(pid) == {path}:
            return
    raise AssertionError(f"threads of {pid} not all in {path}: {thread_cgroups(pid)}")


def cgroup_path(group: Path) -> str:
    """A cgroup's path as /proc/PID/cgroup and the records name it."""
    return "/" + str(group.relative_to(V1)) if group != V1 else "/"


@pytest.fixture(scope="module", autouse=True)
def home(own_cpu) -> Path:
    """Where the stand-in starts: the test's own cgroup of maximal weight
    (requested before the pipeline, which starts in it too), else the root."""
    if not (V1 / "tasks").exists():
        pytest.skip("needs the cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu")
    return own_cpu if own_cpu is not None and own_cpu.is_relative_to(V1) else V1


@pytest.fixture
def quota_cgroup(home):
    """A fresh cpu cgroup below ``home`` with a quota of 0.1 CPUs (10 ms per 100 ms); removed at the end."""
    group = home / f"jitterscope-test-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("10000")
        yield cgroup_path(group), group
    finally:
        remove_cgroup(group)


@pytest.fixture(scope="module")
def pipeline(stack):
    otlp_port = free_port()
    # a grace long enough for throttling records from a collector slowed by a loaded 2-CPU test host
    worker = stack.start_worker_with(JITTERSCOPE_ATTRIBUTION_GRACE_S="5", JITTERSCOPE_REQUEST_SLO_MS=str(SLO_MS))
    # a name nothing has: the stand-in is watched only because it sends spans
    collector = stack.start_collector(
        JITTERSCOPE_TARGET_COMMS='["no-such-process"]', JITTERSCOPE_TARGET_RESCAN_S="1",
        JITTERSCOPE_OTLP_PORT=str(otlp_port))
    yield stack, worker, collector, otlp_port


def process_records(stack, pid: int) -> list[tuple[int, str]]:
    """(epoch ns, cgroup) of each stored record of the process, oldest first."""
    return [(int(ts), cgroup) for ts, cgroup in stack.query(
        "SELECT toUnixTimestamp64Nano(ts), cgroup FROM jitterscope.processes FINAL WHERE pid = {pid:UInt32} "
        "ORDER BY ts", pid=pid)]


def throttling(stack, path: str):
    return stack.query("SELECT count(), sum(nr_periods), sum(nr_throttled), sum(throttled_ns) "
                       "FROM jitterscope.cgroup_throttle FINAL WHERE cgroup = {cg:String}", cg=path)[0]


def test_a_standin_moved_into_a_quota_cgroup_is_cfs_throttling_not_a_neighbour(pipeline, home, quota_cgroup):
    stack, worker, collector, otlp_port = pipeline
    path, group = quota_cgroup
    standin = subprocess.Popen(  # in ``home``, whatever the test's own cgroup is
        ["sh", "-c", f'echo $$ > {home / "cgroup.procs"}; exec "$@"', "sh", sys.executable, str(STANDIN),
         "--endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces", "--pin-cpu", str(last_cpu()),
         "--requests", str(BEFORE + AFTER), "--cpu-ms", "10", "--gap-ms", "5", "--id-prefix", "mv-", "--times"],
        stdout=subprocess.PIPE, text=True)
    lines: list[list[str]] = []  # request_id start_ns end_ns, as they end

    def read() -> None:
        for line in standin.stdout:
            lines.append(line.split())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        pid = standin.pid
        wait_until(lambda: len(lines) >= BEFORE, 120, "the first batch of requests")
        os.kill(pid, signal.SIGSTOP)
        # the collector described it before the move: its record names the cgroup without a quota
        first = wait_until(lambda: process_records(stack, pid), 60, "the stand-in's process record", worker)
        assert first[0][1] == cgroup_path(home) and thread_cgroups(pid) == {cgroup_path(home)}, (
            first, thread_cgroups(pid))
        throttled_before = cpu_stat(group)["nr_throttled"]
        move_threads(pid, group, path)
        moved_at = time.time_ns()
        os.kill(pid, signal.SIGCONT)
        assert standin.wait(180) == 0
        reader.join(30)
        throttled_after = cpu_stat(group)["nr_throttled"]
    finally:
        if standin.poll() is None:
            standin.kill()
            standin.wait()
    assert len(lines) == BEFORE + AFTER
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.request_attribution FINAL "
                                   "WHERE request_id = {id:String}", id=lines[-1][0])[0][0], 90,
               "the last request attributed", worker)
    stored_rows, stored_periods, stored_throttled, stored_throttled_ns = wait_until(
        lambda: (row := throttling(stack, path))[2] and row, 60, "throttled periods stored", worker)
    # When the collector noticed the move: its new record (and, at the same
    # rescan, the cfs sampler's first look at the quota cgroup), published
    # seconds before the last request's attribution. A collector that never
    # notices is judged from its next rescan on (1 s), and fails below.
    records = process_records(stack, pid)
    noticed_at = next((ts for ts, cgroup in records if cgroup == path), moved_at + 2 * SECOND)

    rows = {r[0]: r[1:] for r in stack.query(
        "SELECT request_id, cause, excess_ns, throttled_ns, duration_ns, slo_breached, explained "
        "FROM jitterscope.request_attribution FINAL WHERE startsWith(request_id, 'mv-')")}
    before = [rows[rid] for rid, _, end in lines if int(end) < moved_at]
    after = [rows[rid] for rid, start, _ in lines if int(start) > moved_at]
    # from the collector's first look at the new cgroup on (throttling before
    # it is in no sampled interval: the sampler had no baseline of its own)
    judged = [rows[rid] for rid, start, _ in lines if int(start) > noticed_at + int(CFS_INTERVAL_S * 1e9)]
    gap = [rows[rid] for rid, start, _ in lines if moved_at < int(start) <= noticed_at + int(CFS_INTERVAL_S * 1e9)]
    slow = [r for r in judged if r[4]]
    throttled = [r for r in slow if r[0] == "cfs_throttling" and r[2] > 0]
    share = len(throttled) / len(slow) if slow else 0.0
    slow_after = [r for r in after if r[4]]
    # the sampler looks for moves on its own 0.25 s clock: from the first second after the move on
    slow_from_1s = [rows[rid] for rid, start, _ in lines if int(start) > moved_at + SECOND and rows[rid][4]]
    share_from_1s = sum(r[0] == "cfs_throttling" and r[2] > 0 for r in slow_from_1s) / max(1, len(slow_from_1s))
    print(f"\n[measured] moved stand-in: explained >= 0.9 for {sum(r[5] >= 0.9 for r in slow)} of {len(slow)} slow "
          f"(issue 34's measure); {len(throttled)}/{len(slow)} = {share:.0%} slow requests after the "
          f"collector noticed ({(noticed_at - moved_at) / 1e9:.2f} s after the move) cfs_throttling, "
          f"{share_from_1s:.0%} of the {len(slow_from_1s)} from the first second after the move "
          f"(other causes {sorted({r[0] for r in slow} - {'cfs_throttling'})}); "
          f"{len(gap)} requests in between, slow ones: {sorted(r[0] for r in gap if r[4])}; all after the move: "
          f"{sum(r[0] == 'cfs_throttling' for r in slow_after)}/{len(slow_after)} slow ones cfs_throttling; "
          f"before the move {sum(r[0] == 'cfs_throttling' for r in before)}/{len(before)} cfs_throttling; "
          f"cpu.stat nr_throttled +{throttled_after - throttled_before}; stored {stored_rows} cgroup_throttle rows, "
          f"{stored_throttled}/{stored_periods} periods throttled, {stored_throttled_ns / MS:.0f} ms; "
          f"median duration {statistics.median(r[3] for r in before) / MS:.1f} ms before, "
          f"{statistics.median(r[3] for r in after) / MS:.1f} ms after")

    # the premise: the quota really throttled the stand-in, and its requests got slower
    assert throttled_after - throttled_before >= 10, (throttled_before, throttled_after)
    assert statistics.median(r[3] for r in after) >= 2 * statistics.median(r[3] for r in before)
    assert len(before) >= BEFORE and not [r for r in before if r[0] == "cfs_throttling"]
    assert len(slow) >= AFTER // 2, slow
    assert share >= 0.9, ("the slow ones not cfs_throttling (cause, excess, throttled, duration, slo, explained):",
                          [r for r in slow if r not in throttled], f"noticed {(noticed_at - moved_at) / 1e9:.2f} s after")
    assert share_from_1s >= 0.9, slow_from_1s
    latest = stack.query("SELECT argMax(cgroup, ts) FROM jitterscope.processes FINAL WHERE pid = {pid:UInt32}",
                         pid=pid)[0][0]
    assert latest == path, records
    # noticed by the cfs sampler (0.25 s) or at a rescan, not at the minute's refresh of process records
    assert noticed_at - moved_at < 10 * SECOND, (moved_at, records)
