# SPDX-License-Identifier: Apache-2.0
"""A process moved into another cgroup after the collector described it
(``systemctl set-property``, ``cgclassify``, a supervisor): on a copy of a
fixture /proc tree, the collector's rescan re-reads the cpu cgroup of the
processes whose evidence matters and describes a moved one again at once;
the cfs sampler samples the new cgroup from the same rescan on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jitterscope.collector import hostinfo
from jitterscope.collector.agent import Collector
from jitterscope.collector.probes import throttle
from jitterscope.collector.probes.interface import ProbeContext
from jitterscope.common.settings import Settings
from jitterscope.schemas import events

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host-2node"
SERVICE = "/system.slice/vllm.service"
QUOTA = "/limited"


class Discard:
    def send(self, topic, batch):
        pass


@pytest.fixture
def proc(tmp_path) -> Path:
    copy = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", copy)
    return copy


def collector(tmp_path: Path, proc: Path, **settings) -> Collector:
    return Collector(Settings(data_dir=tmp_path, spool_max_mb=0, **settings), publisher=Discard(),
                     proc=proc, sys=FIXTURES / "sys")


def described(c: Collector) -> list[events.ProcessInfo]:
    return [r for _, batch in c.batcher.drain() for r in batch if isinstance(r, events.ProcessInfo)]


def move(proc: Path, pid: int, cgroup: str) -> None:
    """What cgclassify does, as /proc/PID/cgroup then tells it (cgroup v1's cpu line)."""
    (proc / str(pid) / "cgroup").write_text(f"9:name=systemd:/\n4:cpu,cpuacct:{cgroup}\n0::/\n")


def test_process_cgroup_is_process_infos_cgroup():
    proc = FIXTURES / "proc"
    for pid in (2, 1234, 1240, 4321):
        assert hostinfo.process_cgroup(pid, proc) == hostinfo.process_info(pid, proc)["cgroup"]
    assert hostinfo.process_cgroup(1234, proc) == SERVICE
    with pytest.raises(hostinfo.ProcessGone):
        hostinfo.process_cgroup(99999, proc)


def test_a_serving_process_moved_to_another_cgroup_is_described_again_at_the_next_rescan(tmp_path, proc):
    c = collector(tmp_path, proc, serving_group="process")
    c._serving_pids.add(1234)  # as take_requests does for a span's pid
    c.refresh_groups()
    assert [(r.pid, r.cgroup, r.serving_group) for r in described(c)] == [(1234, SERVICE, 1234)]
    c.refresh_groups()
    assert described(c) == []  # unchanged: nothing until PROCESS_REFRESH_NS

    move(proc, 1234, QUOTA)
    c.refresh_groups()
    assert [(r.pid, r.cgroup, r.serving_group) for r in described(c)] == [(1234, QUOTA, 1234)]
    c.refresh_groups()
    assert described(c) == []  # once per move

    shutil.rmtree(proc / "1234")  # exited: nothing to read, nothing sent, no error
    c.refresh_groups()
    assert described(c) == []


def test_filtered_targets_are_watched_and_other_described_processes_are_not(tmp_path, proc):
    c = collector(tmp_path, proc, target_comms=["<script>*"], target_pids=[2])
    for pid in (4321, 2, 1234):  # as the runq probe does for a target's waits and their suspects
        c.describe_process(pid)
    assert {r.pid for r in described(c)} == {4321, 2, 1234}
    for pid in (4321, 2, 1234):
        move(proc, pid, QUOTA)
    c.refresh_groups()
    # targets by comm and by pid again; 1234 (not a target, e.g. a suspect) waits for its refresh
    assert sorted((r.pid, r.cgroup) for r in described(c)) == [(2, QUOTA), (4321, QUOTA)]


def test_what_is_kept_per_pid_goes_when_the_process_exits(tmp_path, proc):
    c = collector(tmp_path, proc, serving_group="process")
    c._serving_pids.add(1234)
    c.refresh_groups()
    assert set(c._sent_as) == {1234}
    shutil.rmtree(proc / "1234")
    c.publish_histograms(1)  # forgets the exited processes
    c.refresh_groups()
    assert c._sent_as == {}


def v1_group(sys: Path, path: str, quota: int, periods: int = 0, throttled: int = 0) -> None:
    d = sys / "fs/cgroup/cpu" / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    (d / "cpu.stat").write_text(f"nr_periods {periods}\nnr_throttled {throttled}\n"
                                f"throttled_time {throttled * 90_000_000}\n")


class Stamp:
    def header(self, record_type, ts_ns):
        return dict(host="h", boot_id="b", seq=0, ts_ns=ts_ns)


def test_the_cfs_sampler_follows_a_target_into_its_new_quota_cgroup(tmp_path):
    sys, pid = tmp_path / "sys", 4242
    v1_group(sys, "/", -1)
    v1_group(sys, QUOTA, 10_000, periods=100, throttled=50)  # its history before the move is not ours
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text("4:cpu,cpuacct:/\n0::/\n")
    signal = throttle.ThrottleSignal()
    # a sampling interval longer than the test: only periodic() reads
    signal.open(ProbeContext(settings=Settings.model_construct(cfs_interval_s=3600), stamp=Stamp(),
                             publish=lambda r: None, describe_process=lambda pid: None, comm_of=lambda pid: "",
                             targets={pid}, proc=tmp_path / "proc", sys=sys))
    try:
        assert signal.periodic(0, 0) == []  # in the root cgroup: nothing to sample
        move(tmp_path / "proc", pid, QUOTA)
        signal.rescan()  # the agent's next target rescan
        v1_group(sys, QUOTA, 10_000, periods=110, throttled=58)
        records = signal.periodic(0, 0)
    finally:
        signal.close()
    assert [(r.cgroup, r.quota_us, r.nr_periods, r.nr_throttled) for r in records] == [(QUOTA, 10_000, 10, 8)]


def test_a_serving_process_that_renames_itself_is_described_again_by_its_new_name(tmp_path, proc):
    c = collector(tmp_path, proc, serving_group="process")
    c._serving_pids.add(1234)
    c.refresh_groups()
    first = described(c)
    assert [r.pid for r in first] == [1234]
    (proc / "1234" / "comm").write_text("VLLM::EngineCor\n")  # prctl(PR_SET_NAME) after start
    c.refresh_groups()
    assert [(r.pid, r.comm) for r in described(c)] == [(1234, "VLLM::EngineCor")]
    c.refresh_groups()
    assert described(c) == []  # once per rename


def test_the_cfs_sampler_sees_a_serving_process_move_on_its_own_clock(tmp_path):
    sys, pid = tmp_path / "sys", 4242
    v1_group(sys, "/", -1)
    v1_group(sys, QUOTA, 10_000, periods=100, throttled=50)
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text("4:cpu,cpuacct:/\n0::/\n")
    again: list[int] = []
    signal = throttle.ThrottleSignal()
    # every process watched (targets None); 4242 serves requests (it has a threshold of its own)
    signal.open(ProbeContext(settings=Settings.model_construct(cfs_interval_s=3600), stamp=Stamp(),
                             publish=lambda r: None, describe_process=lambda pid: None, comm_of=lambda pid: "",
                             targets=None, thresholds={pid: 1_000_000}, proc=tmp_path / "proc", sys=sys,
                             describe_again=again.append))
    try:
        assert signal.periodic(0, 0) == []
        move(tmp_path / "proc", pid, QUOTA)
        assert signal.periodic(0, 0) == []  # a sample, no rescan: the move seen, the new cgroup's baseline taken
        signal.poll()
        assert again == [pid]  # its record again now, naming the quota cgroup
        v1_group(sys, QUOTA, 10_000, periods=110, throttled=58)
        records = signal.periodic(0, 0)
        signal.poll()
    finally:
        signal.close()
    assert [(r.cgroup, r.nr_periods, r.nr_throttled) for r in records] == [(QUOTA, 10, 8)]
    assert again == [pid]  # once per move


def test_a_process_caught_mid_exec_is_described_again_soon_a_kernel_thread_is_not(tmp_path, proc, monkeypatch):
    """A process read between fork and exec has no command line yet: its record
    is published again after MID_EXEC_RETRY_NS, not PROCESS_REFRESH_NS later
    (a stored record without one looked like a kernel thread to `fix`).
    pid 2 (kthreadd, and every kernel thread's parent) has none for good."""
    from jitterscope.collector import agent

    (proc / "4321" / "cmdline").write_bytes(b"")  # mid-exec
    monkeypatch.setattr(agent, "MID_EXEC_RETRY_NS", 0)
    c = collector(tmp_path, proc)
    for pid in (4321, 2):
        c.describe_process(pid)
    assert {r.pid: r.cmdline for r in described(c)} == {4321: "", 2: ""}
    (proc / "4321" / "cmdline").write_bytes(b"log-archiver\0--daily\0")  # its exec done
    for pid in (4321, 2):
        c.describe_process(pid)
    assert {r.pid: r.cmdline for r in described(c)} == {4321: "log-archiver --daily"}
    c.describe_process(4321)
    assert described(c) == []  # described whole: nothing until PROCESS_REFRESH_NS
