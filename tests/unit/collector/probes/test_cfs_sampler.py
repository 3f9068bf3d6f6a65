# SPDX-License-Identifier: Apache-2.0
"""The cfs sampler (collector/probes/throttle.py) on made-up /proc and /sys
trees: which cgroup a process's cpu controller puts it in (cgroup v1, v2
and the hybrid layout), its quota and counters, ancestors with a pod quota,
and deltas only for quota cgroups that ran."""

from __future__ import annotations

import time
from pathlib import Path

from jitterscope.collector.probes import throttle
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.common.settings import Settings

POD = "/kubepods/burstable/pod1234"
CTR = POD + "/abcdef"


def v1_group(sys: Path, path: str, quota=20000, period=100000, periods=0, throttled=0, time_ns=0,
             mount="cpu,cpuacct") -> Path:
    d = sys / "fs/cgroup" / mount / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")
    (d / "cpu.stat").write_text(f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {time_ns}\n")
    return d


def v2_group(sys: Path, path: str, limit="20000 100000", periods=0, throttled=0, usec=0, base="") -> Path:
    root = sys / "fs/cgroup" / base
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    d = root / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.max").write_text(limit + "\n")
    (d / "cpu.stat").write_text(f"usage_usec 1\nnr_periods {periods}\nnr_throttled {throttled}\n"
                                f"throttled_usec {usec}\n")
    return d


def test_v1_cpu_line_wins_over_the_first_line_and_the_v2_line(tmp_path):
    v1_group(tmp_path, CTR)
    text = f"9:name=systemd:/system.slice\n4:cpu,cpuacct:{CTR}\n0::/\n"
    group = throttle.cpu_cgroup(text, tmp_path)
    assert (group.path, group.v2) == (CTR, False)
    assert [g.path for g in throttle.ancestors(group)] == [CTR, POD, "/kubepods/burstable", "/kubepods"]
    assert throttle.read_stat(group) == throttle.CpuStat(20000, 100000, 0, 0, 0)


def test_v2_and_the_hybrid_layouts_unified_part(tmp_path):
    v2_group(tmp_path / "pure", CTR, periods=7, throttled=3, usec=1500)
    group = throttle.cpu_cgroup(f"0::{CTR}\n", tmp_path / "pure")
    assert group.v2 and throttle.read_stat(group) == throttle.CpuStat(20000, 100000, 7, 3, 1_500_000)
    v2_group(tmp_path / "hybrid", "/svc", limit="max 100000", base="unified")
    group = throttle.cpu_cgroup("1:name=systemd:/svc\n0::/svc\n", tmp_path / "hybrid")
    assert group.dir == tmp_path / "hybrid/fs/cgroup/unified/svc" and throttle.read_stat(group).quota_us == -1
    assert throttle.cpu_cgroup("1:name=systemd:/svc\n", tmp_path / "nothing") is None


def test_quota_cgroups_found_when_every_process_is_watched(tmp_path):
    v1_group(tmp_path, "/limited", mount="cpu")
    v1_group(tmp_path, "/free", quota=-1, mount="cpu")
    v1_group(tmp_path, "/", quota=-1, mount="cpu")
    assert [g.path for g in throttle.quota_cgroups(tmp_path)] == ["/limited"]


def sampler(tmp_path, targets):
    signal = throttle.ThrottleSignal()
    records = []
    # a sampling interval longer than the test: only periodic() reads
    context = ProbeContext(settings=Settings.model_construct(cfs_interval_s=3600), stamp=Stamp(),
                           publish=records.append, describe_process=lambda pid: None, comm_of=lambda pid: "",
                           targets=targets, proc=tmp_path / "proc", sys=tmp_path / "sys")
    signal.open(context)
    return signal


class Stamp:
    def header(self, record_type, ts_ns):
        return dict(host="h", boot_id="b", seq=0, ts_ns=ts_ns)


def test_deltas_of_target_cgroups_and_their_pod_quota_only_when_they_ran(tmp_path):
    sys = tmp_path / "sys"
    ctr = v1_group(sys, CTR, periods=10, throttled=2, time_ns=5_000_000)
    pod = v1_group(sys, POD, quota=40000, periods=10, throttled=0)
    v1_group(sys, "/kubepods/burstable", quota=-1)
    v1_group(sys, "/kubepods", quota=-1)
    (tmp_path / "proc/4242").mkdir(parents=True)
    (tmp_path / "proc/4242/cgroup").write_text(f"2:cpu,cpuacct:{CTR}\n0::/\n")
    signal = sampler(tmp_path, {4242})
    try:
        assert signal.periodic(0, 0) == []  # nothing ran since the baseline
        (ctr / "cpu.stat").write_text("nr_periods 13\nnr_throttled 5\nthrottled_time 95000000\n")
        (pod / "cpu.stat").write_text("nr_periods 12\nnr_throttled 0\nthrottled_time 0\n")
        records = {r.cgroup: r for r in signal.periodic(0, 0)}
    finally:
        signal.close()
    assert set(records) == {CTR, POD}  # the unlimited ancestors make none
    r = records[CTR]
    assert (r.quota_us, r.period_us, r.nr_periods, r.nr_throttled, r.throttled_ns) == (20000, 100000, 3, 3, 90_000_000)
    assert 0 < r.interval_ns < 60_000_000_000  # its own clock's interval
    assert records[POD].nr_throttled == 0 and records[POD].nr_periods == 2


def test_the_sampler_thread_keeps_its_own_clock_and_poll_publishes(tmp_path):
    """Readings are taken every cfs_interval_s whatever the agent's loop
    does; poll() only publishes them (the agent may call it late)."""
    sys = tmp_path / "sys"
    group = v1_group(sys, "/limited", periods=1, mount="cpu")
    (tmp_path / "proc/7").mkdir(parents=True)
    (tmp_path / "proc/7/cgroup").write_text("1:cpu:/limited\n")
    signal = throttle.ThrottleSignal()
    published = []
    signal.open(ProbeContext(settings=Settings.model_construct(cfs_interval_s=0.05), stamp=Stamp(),
                             publish=published.append, describe_process=lambda pid: None, comm_of=lambda pid: "",
                             targets={7}, proc=tmp_path / "proc", sys=sys))
    try:
        for n, periods in enumerate((5, 9), 1):
            (group / "cpu.stat").write_text(f"nr_periods {periods}\nnr_throttled 1\nthrottled_time 10\n")
            deadline = time.monotonic() + 30
            while len(published) < n and time.monotonic() < deadline:
                time.sleep(0.5)  # the agent polls late: the thread's readings wait in between
                signal.poll()
    finally:
        signal.close()
    assert [r.nr_periods for r in published] == [4, 4]
    # each record spans one of the thread's 50 ms intervals, not the 500 ms between polls
    assert all(r.interval_ns < 400_000_000 for r in published), [r.interval_ns for r in published]
