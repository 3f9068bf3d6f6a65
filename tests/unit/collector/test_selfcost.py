# SPDX-License-Identifier: Apache-2.0
"""Self-cost: the overhead share, fdinfo parsing, the running totals and the
lines `up` and `doctor` print -- without the kernel."""

from __future__ import annotations

import json

import pytest

from jitterscope.collector import selfcost
from jitterscope.collector.selfcost import (BpfStats, ProgramStats, SelfCost, format_cost, overhead_share,
                                            parse_fdinfo, program_names, program_stats, scan_programs)
from jitterscope.schemas import events

PROG_FDINFO = """pos:\t0
flags:\t02000002
mnt_id:\t15
ino:\t2087
prog_type:\t5
prog_jited:\t1
prog_tag:\t3b185187f1855c4c
memlock:\t4096
prog_id:\t1280
run_time_ns:\t1502587
run_cnt:\t1396
recursion_misses:\t0
verified_insns:\t412
"""
MAP_FDINFO = "pos:\t0\nflags:\t02000002\nmap_type:\t27\nkey_size:\t0\nmap_id:\t77\n"


def test_overhead_share_is_cpu_time_over_host_cpu_time():
    # 10 ms of BPF + 20 ms of collector over 1 s on 2 CPUs: 1.5% of the host
    assert overhead_share(10_000_000, 20_000_000, 1_000_000_000, 2) == pytest.approx(0.015)
    assert overhead_share(0, 5_000_000, 1_000_000_000, 1) == pytest.approx(0.005)
    assert overhead_share(1, 1, 0, 4) == 0.0  # an empty interval
    assert overhead_share(1_000, 0, 1_000, 0) == 1.0  # cpus unknown counts as one


def test_fdinfo_of_a_program_and_of_a_map():
    info = parse_fdinfo(PROG_FDINFO)
    assert info["prog_tag"] == "3b185187f1855c4c"
    assert program_stats(info, "sched_switch") == ProgramStats(1280, "sched_switch", 1502587, 1396, 0)
    missed = program_stats(parse_fdinfo(PROG_FDINFO.replace("recursion_misses:\t0", "recursion_misses:\t7")))
    assert missed.misses == 7  # runs the kernel skipped: counted, never silent
    assert program_stats(parse_fdinfo(MAP_FDINFO)) is None
    # a kernel without run_time_ns in fdinfo: zeros, the kernel's name falls back to the id
    assert program_stats({"prog_id": "9"}) == ProgramStats(9, "prog9", 0, 0)


def test_scan_finds_programs_once_and_names_them(tmp_path, monkeypatch):
    (tmp_path / "3").write_text(PROG_FDINFO)
    (tmp_path / "4").write_text(PROG_FDINFO)  # a second fd of the same program
    (tmp_path / "5").write_text(MAP_FDINFO)
    (tmp_path / "6").write_text(PROG_FDINFO.replace("1280", "1281").replace("1502587", "10"))
    monkeypatch.setattr(selfcost, "prog_name", lambda fd: "sched__sched_sw")
    found = scan_programs(tmp_path, names={6: "sched_wakeup"})
    assert set(found) == {1280, 1281}
    assert found[1280].name == "sched__sched_sw" and found[1281] == ProgramStats(1281, "sched_wakeup", 10, 1396)


def test_totals_never_go_down_and_shared_names_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(selfcost, "prog_name", lambda fd: "sched__sched_wa")
    monkeypatch.setattr(selfcost, "cpu_ns", lambda: 3_000_000_000)
    (tmp_path / "3").write_text(PROG_FDINFO)
    (tmp_path / "4").write_text(PROG_FDINFO.replace("1280", "1281"))
    cost = SelfCost(fdinfo_dir=tmp_path, stats=BpfStats(tmp_path / "nosysctl"), started_mono_ns=0,
                    started_cpu_ns=1_000_000_000, cpus=2)
    cost.sample()
    assert cost.bpf_run_ns == 2 * 1502587 and cost.bpf_run_count == 2 * 1396
    run_ns, runs = cost.by_program()
    assert run_ns == {"sched__sched_wa#1280": 1502587, "sched__sched_wa#1281": 1502587}
    (tmp_path / "4").unlink()  # a probe closed: its program's counts stay in the totals
    cost.sample()
    assert cost.bpf_run_ns == 2 * 1502587
    # 2 s of collector CPU + 3 ms of BPF over 10 s on 2 CPUs
    assert cost.interval(now_ns=10_000_000_000) == pytest.approx((2e9 + 2 * 1502587) / 20e9)
    summary = cost.summary(now_ns=10_000_000_000)
    assert summary["collector_share"] == pytest.approx(0.1)
    assert summary["overhead_share"] == pytest.approx(summary["bpf_share"] + summary["collector_share"])
    fields = cost.record_fields()
    record = events.CollectorStats(host="h", boot_id="b", seq=1, ts_ns=1, started_ns=1, ringbuf_drops=0,
                                   events_read=0, records_sent=0, delivery_errors=0, **fields)
    assert record.bpf_run_count_by_program["sched__sched_wa#1280"] == 1396 and record.online_cpus == 2


def test_sysctl_fallback_restores_the_previous_value(tmp_path, monkeypatch):
    def no_enable_fd():
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(selfcost, "enable_stats_fd", no_enable_fd)
    sysctl = tmp_path / "bpf_stats_enabled"
    sysctl.write_text("0\n")
    with BpfStats(sysctl) as stats:
        assert stats.how == "sysctl" and sysctl.read_text().strip() == "1"
    assert sysctl.read_text().strip() == "0"
    sysctl.write_text("1\n")  # someone else had them on: left on
    with BpfStats(sysctl):
        pass
    assert sysctl.read_text().strip() == "1"
    with BpfStats(tmp_path / "missing" / "sysctl") as stats:  # neither way works: measured without BPF times
        assert stats.how == "off"


def test_program_names_from_probes():
    class Probe:
        def program_fds(self):
            return {"tracepoint__sched__sched_wakeup_new": 20, "on_ioctl": 7}

    class Closed:
        def program_fds(self):
            raise AttributeError("closed")

    assert program_names([Probe(), None, Closed(), {"not": "a probe"}]) == {20: "sched__sched_wakeup_new",
                                                                            7: "on_ioctl"}


def test_the_lines_up_and_doctor_print(tmp_path):
    from jitterscope.up import self_cost_line

    line = format_cost({"overhead_share": 0.003, "bpf_share": 0.001, "collector_share": 0.002,
                        "rss_bytes": 180_000_000})
    assert line == "jitterscope cost on this host: 0.30% of CPU (BPF 0.10%, collector 0.20%), collector RSS 180 MB"
    final = tmp_path / "collector-final.json"
    assert self_cost_line(final) is None
    final.write_text(json.dumps({"sent_by_topic": {}}))  # from a collector before self-cost
    assert self_cost_line(final) is None
    final.write_text(json.dumps({"sent_by_topic": {}, "self_cost": {"overhead_share": 0.003, "bpf_share": 0.001,
                                                                    "collector_share": 0.002,
                                                                    "rss_bytes": 180_000_000}}))
    assert self_cost_line(final) == line


def test_doctor_shows_the_last_figures(tmp_path):
    from jitterscope.common.settings import Settings
    from jitterscope.doctor import check_self_cost

    s = Settings(data_dir=tmp_path)
    assert check_self_cost(s).ok and "no collector run" in check_self_cost(s).detail
    (tmp_path / "collector-final.json").write_text(json.dumps({"self_cost": {
        "overhead_share": 0.004, "bpf_share": 0.001, "collector_share": 0.003, "rss_bytes": 90_000_000}}))
    check = check_self_cost(s)
    assert check.ok and "0.40% of CPU" in check.detail and "RSS 90 MB" in check.detail
    assert not check.warn and "within the 0.50% target" in check.detail


def test_doctor_and_the_report_judge_self_cost_by_one_target(tmp_path):
    """Issue 20: doctor said 1.51% "ok" while the report marked the same
    figure "no" against 0.5%. Both now read self_cost_target_pct."""
    from jitterscope.common.settings import Settings
    from jitterscope.doctor import check_self_cost
    from jitterscope.reports import capacity

    (tmp_path / "collector-final.json").write_text(json.dumps({"self_cost": {
        "overhead_share": 0.0151, "bpf_share": 0.005, "collector_share": 0.0101, "rss_bytes": 90_000_000}}))

    def query(sql, params):  # the share per host (the section's other table has no rows here)
        return [("gpu-1", 30, 0.0151, 0.02, 181.5, 2)] if "overhead_share" in sql else []

    for target_pct, over in ((0.5, True), (2.0, False)):
        s = Settings(data_dir=tmp_path, self_cost_target_pct=target_pct)
        check = check_self_cost(s)
        assert check.ok and check.warn == over and f"the {target_pct:.2f}% target" in check.detail
        assert "self_cost_target_pct" in check.fix
        html = capacity.cost_of_watching(capacity.Context(query, 86400, None,
                                                          self_cost_target=s.self_cost_target_pct / 100))
        assert f"under {target_pct:.2f}%" in html and ("<td>no</td>" if over else "<td>yes</td>") in html
    assert capacity.Context(query, 86400, None).self_cost_target == Settings().self_cost_target_pct / 100


def test_cost_of_watching_section_escapes_host_names():
    from jitterscope.reports import capacity

    seen = []

    def query(sql, params):
        seen.append(sql)
        if "overhead_share" not in sql:  # the section's other table: its own test (test_cost_of_watching.py)
            return []
        return [("<b>gpu-1</b>", 30, 0.0062, 0.009, 181.5, 16), ("quiet", 3, 0.0001, 0.0002, 90.0, 2)]

    ctx = capacity.Context(query, since_s=86400, remediation=None)
    assert ("cost", "Cost of watching") in capacity.SECTIONS
    html = capacity.BUILDERS["cost"](ctx)
    assert "collector_stats" in seen[0]
    assert "&lt;b&gt;gpu-1&lt;/b&gt;" in html and "<b>gpu-1" not in html
    assert "0.620%" in html and "<td>no</td>" in html and "<td>yes</td>" in html
    summary = capacity.BUILDERS["summary"](ctx)  # its warning reads the same rows: not queried again
    assert "cost-warning" in summary and sum("overhead_share" in sql for sql in seen) == 1


def test_named_programs_are_read_alone_between_full_scans(tmp_path, monkeypatch):
    monkeypatch.setattr(selfcost, "prog_name", lambda fd: "sched__sched_wa")
    (tmp_path / "3").write_text(PROG_FDINFO)
    (tmp_path / "4").write_text(PROG_FDINFO.replace("1280", "1281"))  # no probe names it
    assert set(scan_programs(tmp_path, {3: "sched_switch"}, only_named=True)) == {1280}
    cost = SelfCost(fdinfo_dir=tmp_path, stats=BpfStats(tmp_path / "nosysctl"), started_mono_ns=0,
                    started_cpu_ns=0, cpus=2)
    cost.sample({3: "sched_switch"})  # the first sample reads every fd
    assert set(cost.programs) == {1280, 1281}
    (tmp_path / "4").write_text(PROG_FDINFO.replace("1280", "1281").replace("1502587", "2000000"))
    cost.sample({3: "sched_switch"})  # then only the named ones ...
    assert cost.programs[1281].run_ns == 1502587
    for _ in range(selfcost.FULL_SCAN_EVERY - 1):
        cost.sample({3: "sched_switch"})
    assert cost.programs[1281].run_ns == 2000000  # ... until the next full scan
