# SPDX-License-Identifier: Apache-2.0
"""streams/rules/runq.py and rules/requests.py: run-queue starvation and
request-SLO alerts, and the cpulist formatter."""

import pytest

from jitterscope.schemas.topology import cpu_list as format_cpus
from jitterscope.streams.rules.runq import ProcessView, runq_starvation
from jitterscope.schemas.events import RunqEvent

MS = 1_000_000
ALERT_NS = 10 * MS
NOW = 1_700_000_000_500_000_000


def event(wait_ns: int = 25 * MS, **kw) -> RunqEvent:
    fields = dict(host="gpu-a1", boot_id="b0", seq=42, ts_ns=1_700_000_000_000_000_000,
                  pid=1234, tid=1240, comm="python3", cpu=2, wait_ns=wait_ns,
                  suspect_pid=4321, suspect_tid=4322, suspect_comm="backup")
    fields.update(kw)
    return RunqEvent(**fields)


VICTIM = ProcessView(comm="python3", cpus_allowed=[0, 1, 2, 3])
HOST_CPUS = [0, 1, 2, 3, 4, 5, 6, 9]


@pytest.mark.parametrize("cpus, text", [
    ([0, 1, 2, 5], "0-2,5"),
    ([5, 2, 1, 0, 2], "0-2,5"),
    ([7], "7"),
    ([], ""),
    ([0, 2, 4], "0,2,4"),
    ([4, 5, 6, 7, 10, 11], "4-7,10-11"),
])
def test_format_cpus(cpus, text):
    assert format_cpus(cpus) == text


def test_below_the_alert_threshold_no_alert():
    assert runq_starvation(event(ALERT_NS - 1), ALERT_NS, VICTIM, HOST_CPUS, NOW) is None


def test_at_the_threshold_alerts():
    assert runq_starvation(event(ALERT_NS), ALERT_NS, VICTIM, HOST_CPUS, NOW) is not None


def test_alert_names_victim_wait_and_suspect():
    alert = runq_starvation(event(25 * MS), ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert alert.kind == "runq_starvation"
    assert (alert.pid, alert.tid, alert.comm, alert.cpu) == (1234, 1240, "python3", 2)
    assert (alert.suspect_pid, alert.suspect_comm) == (4321, "backup")
    assert alert.wait_ns == 25 * MS
    assert alert.cpus_allowed == [0, 1, 2, 3]
    assert "python3 (pid 1234, tid 1240)" in alert.summary
    assert "25.0 ms" in alert.summary
    assert "CPU 2" in alert.summary
    assert "backup (pid 4321)" in alert.summary


def test_alert_keeps_the_evidence_key_and_raise_time():
    alert = runq_starvation(event(), ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert (alert.host, alert.boot_id, alert.seq) == ("gpu-a1", "b0", 42)
    assert alert.ts_ns == 1_700_000_000_000_000_000
    assert alert.raised_ns == NOW


def test_remedy_moves_the_suspect_to_the_other_cpus():
    alert = runq_starvation(event(), ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert "taskset -apc 4-6,9 4321" in alert.remedy
    assert "0-3" in alert.remedy  # the CPUs to reserve for the victim


@pytest.mark.parametrize("wait_ns, severity", [
    (ALERT_NS, "warning"),
    (10 * ALERT_NS - 1, "warning"),
    (10 * ALERT_NS, "critical"),
    (50 * ALERT_NS, "critical"),
])
def test_severity(wait_ns, severity):
    assert runq_starvation(event(wait_ns), ALERT_NS, VICTIM, HOST_CPUS, NOW).severity == severity


def test_self_competition_remedy():
    alert = runq_starvation(event(suspect_pid=1234, suspect_tid=1250, suspect_comm="python3"),
                            ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert "own threads" in alert.remedy
    assert "0-3" in alert.remedy
    assert "taskset" not in alert.remedy


def test_no_other_cpus_suggests_renice():
    everything = ProcessView(comm="python3", cpus_allowed=HOST_CPUS)
    alert = runq_starvation(event(), ALERT_NS, everything, HOST_CPUS, NOW)
    assert "renice 19 -p 4321" in alert.remedy
    assert "taskset" not in alert.remedy


def test_unknown_host_cpus_suggests_renice():
    alert = runq_starvation(event(), ALERT_NS, VICTIM, None, NOW)
    assert "renice 19 -p 4321" in alert.remedy


def test_unknown_victim_still_alerts():
    alert = runq_starvation(event(), ALERT_NS, None, HOST_CPUS, NOW)
    assert alert is not None
    assert alert.cpus_allowed == []
    assert alert.pid == 1234 and alert.comm == "python3"
    assert "backup (pid 4321)" in alert.summary
    assert "taskset" not in alert.remedy  # no basis for a CPU split


def test_idle_suspect_summary():
    alert = runq_starvation(event(suspect_pid=0, suspect_tid=0, suspect_comm="swapper/2"),
                            ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert "idle/kernel task" in alert.summary
    assert "swapper" not in alert.summary


def test_idle_suspect_remedy_points_at_the_kernel_not_the_victim():
    alert = runq_starvation(event(suspect_pid=0, suspect_tid=0, suspect_comm="swapper/2"),
                            ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert "kernel" in alert.remedy and "irq" in alert.remedy.lower()
    assert "own threads" not in alert.remedy


def attribution(**kw):
    from jitterscope.schemas.events import RequestAttribution, Suspect

    fields = dict(host="gpu-a1", boot_id="b0", seq=7, ts_ns=NOW, request_id="req-42", trace_id="ab" * 16,
                  name="llm_request", pid=1234, start_ns=NOW - 400 * MS, end_ns=NOW, duration_ns=400 * MS,
                  baseline_ns=75 * MS, excess_ns=325 * MS, status="ok", runq_wait_ns=300 * MS,
                  runq_wait_max_ns=40 * MS, runq_waits=12,
                  suspects=[Suspect(pid=4321, comm="logrotate", wait_ns=250 * MS)],
                  cause="runq_starvation", explained=0.92, slo_ns=375 * MS, slo_breached=True)
    fields.update(kw)
    return RequestAttribution(**fields)


def test_request_slo_names_the_request_the_wait_and_the_suspect():
    from jitterscope.streams.rules.requests import request_slo

    alert = request_slo(attribution(culprit_stack=0xfeed), "python3", [2, 3], [0, 1, 2, 3, 4, 5], NOW)
    assert alert.kind == "request_slo" and alert.request_id == "req-42"
    assert alert.suspect_stack == 0xfeed  # the culprit's stack, joinable with the stacks table
    assert "400 ms" in alert.summary and "SLO 375 ms" in alert.summary and "normal 75 ms" in alert.summary
    assert "waited 300 ms" in alert.summary and "logrotate (pid 4321)" in alert.summary
    assert alert.remedy == "move logrotate (pid 4321) off the CPUs of pid 1234: taskset -apc 0-1,4-5 4321"
    assert (alert.host, alert.boot_id, alert.seq) == ("gpu-a1", "b0", 7)
    assert alert.severity == "warning"


def test_request_slo_quiet_unless_breached_and_honest_when_unexplained():
    from jitterscope.streams.rules.requests import request_slo

    assert request_slo(attribution(slo_breached=False), "python3", [], None, NOW) is None
    alert = request_slo(attribution(cause="unexplained", explained=0.1, suspects=[], runq_wait_ns=30 * MS),
                        "python3", [], None, NOW)
    assert "unexplained" in alert.summary and "10%" in alert.summary
    assert "no kernel evidence" in alert.remedy and alert.suspect_pid == 0


def test_jitterscope_as_the_culprit_is_the_cost_of_watching_not_a_neighbour_to_move():
    alert = runq_starvation(event(suspect_comm="jitterscope:worker", suspect_own=True), ALERT_NS, VICTIM,
                            HOST_CPUS, NOW)
    assert "jitterscope itself (worker, pid 4321) held it" in alert.summary
    assert alert.remedy.startswith("the cost of watching") and "runq_threshold_ms" in alert.remedy
    assert "move jitterscope" not in alert.remedy


@pytest.mark.parametrize("comm", ["jitterscope:up", "?jitterscope:up"])
def test_a_process_named_like_jitterscope_is_a_neighbour_not_the_cost_of_watching(comm):
    """Own processes are known by pid (the collector's ``suspect_own``),
    never by name: ``cp /bin/yes /tmp/jitterscope:up`` is a neighbour to move,
    whether its name reached the rule as it chose it or marked (issue 40, 8)."""
    alert = runq_starvation(event(suspect_comm=comm), ALERT_NS, VICTIM, HOST_CPUS, NOW)
    assert f"{comm} (pid 4321) held it" in alert.summary and "jitterscope itself" not in alert.summary
    assert alert.remedy.startswith(f"move {comm} off the inference CPUs")
    assert "cost of watching" not in alert.remedy
