"""jitterscope/stack.py format_alert: the one line `jitterscope up` prints per alert."""

from datetime import datetime

from jitterscope.schemas.events import Alert
from jitterscope.stack import format_alert

TS = 1_700_000_000_123_456_789


def alert(**kw) -> Alert:
    fields = dict(host="gpu-a1", boot_id="b0", seq=42, ts_ns=TS, raised_ns=TS + 5_000_000,
                  kind="runq_starvation", severity="critical", pid=1234, tid=1240, comm="python3",
                  cpu=2, wait_ns=123_456_789, suspect_pid=4321, suspect_comm="backup",
                  cpus_allowed=[0, 1, 2, 3], summary="s", remedy="r")
    fields.update(kw)
    return Alert(**fields)


def test_names_host_victim_wait_cpu_and_suspect():
    line = format_alert(alert())
    assert "gpu-a1" in line
    assert "[critical]" in line
    assert "python3 (pid 1234, tid 1240)" in line
    assert "123.5 ms" in line
    assert "CPU 2" in line
    assert "backup (pid 4321)" in line
    assert "\n" not in line


def test_time_of_the_evidence_with_milliseconds():
    line = format_alert(alert())
    expected = datetime.fromtimestamp(TS / 1e9).strftime("%H:%M:%S.%f")[:-3]
    assert line.startswith(expected + " ")
    assert expected.endswith(".123")


def test_wait_has_one_decimal():
    assert "waited 10.0 ms" in format_alert(alert(wait_ns=10_000_000))
    assert "waited 10.1 ms" in format_alert(alert(wait_ns=10_050_001))


def test_idle_suspect():
    line = format_alert(alert(suspect_pid=0, suspect_comm="swapper/2"))
    assert "idle" in line
    assert "swapper" not in line
    assert "pid 0" not in line


def test_hostile_comm_is_kept_verbatim():
    line = format_alert(alert(comm="<script>[bold]", suspect_comm="[red]x"))
    assert "<script>[bold] (pid 1234" in line
    assert "[red]x (pid 4321)" in line


def test_request_alerts_print_their_summary():
    from jitterscope.schemas.events import Alert
    from jitterscope.stack import format_alert

    alert = Alert(host="gpu-a1", boot_id="b", seq=1, ts_ns=1_700_000_000_000_000_000, raised_ns=0,
                  kind="request_slo", severity="critical", pid=1, tid=0, comm="vllm", cpu=0, wait_ns=0,
                  suspect_pid=2, suspect_comm="jshog", cpus_allowed=[], request_id="req-7",
                  summary="request req-7 (llm_request) took 80 ms, SLO 30 ms", remedy="x")
    line = format_alert(alert)
    assert "gpu-a1 [critical] request req-7 (llm_request) took 80 ms, SLO 30 ms" in line
