# SPDX-License-Identifier: Apache-2.0
"""cli/up.py format_alert: the one line `jitterscope up` prints per alert."""

from datetime import datetime

from jitterscope.schemas.events import Alert
from jitterscope.alert_lines import format_alert

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


def test_group_announcements_say_how_many_and_resolutions_say_quiet():
    again = format_alert(alert(evidence={"state": "firing", "group_count": "7"}, victim_stack=9))
    assert again.endswith("(7 so far) seq 42")
    done = format_alert(alert(evidence={"state": "resolved", "group_count": "7", "group_worst_ns": "25000000"}))
    assert "[resolved]" in done and "7 alert(s)" in done and "worst 25.0 ms" in done and "waited" not in done


def test_a_seq_is_printed_only_where_stacks_would_find_something():
    assert format_alert(alert(suspect_stack=9)).endswith(" seq 42")  # `jitterscope stacks --alert 42` shows it
    assert format_alert(alert(victim_stack=9, evidence={"group_count": "1"})).endswith(" seq 42")
    assert "seq" not in format_alert(alert())  # no stack captured: "none captured" would be all it said
    assert format_alert(alert(kind="request_slo", summary="req-1 took 54 ms", victim_stack=9)).endswith(
        "req-1 took 54 ms")  # stacks --alert takes run-queue alerts only


def test_repeats_and_resolutions_start_with_when_they_are_printed_in_order():
    # the case: a group first seen at 17:17:00 re-announced a minute later
    printed = TS + 60 * 1_000_000_000
    group = {"group_count": "384", "group_first_ns": str(TS)}
    lines = [format_alert(alert(evidence={"state": "firing", **group}), printed_ns=printed),
             format_alert(alert(evidence={"state": "resolved", "group_worst_ns": "1", **group}),
                          printed_ns=printed + 1_000_000)]
    starts = [line.split(" ")[0] for line in lines]
    assert starts == sorted(starts) and starts[0] == datetime.fromtimestamp(printed / 1e9).strftime("%H:%M:%S.%f")[:-3]
    first = datetime.fromtimestamp(TS / 1e9).strftime("%H:%M:%S.%f")[:-3]
    assert all(f"since {first}" in line for line in lines)


def test_request_alerts_print_their_summary():
    from jitterscope.schemas.events import Alert
    from jitterscope.alert_lines import format_alert

    alert = Alert(host="gpu-a1", boot_id="b", seq=1, ts_ns=1_700_000_000_000_000_000, raised_ns=0,
                  kind="request_slo", severity="critical", pid=1, tid=0, comm="vllm", cpu=0, wait_ns=0,
                  suspect_pid=2, suspect_comm="jshog", cpus_allowed=[], request_id="req-7",
                  summary="request req-7 (llm_request) took 80 ms, SLO 30 ms", remedy="x")
    line = format_alert(alert)
    assert "gpu-a1 [critical] request req-7 (llm_request) took 80 ms, SLO 30 ms" in line


# -- control characters never reach the operator's terminal ------------------

def test_escape_sequences_in_names_are_made_visible_not_executed():
    line = format_alert(alert(comm="evil\x1b[2J\x1b]0;pwned\x07", suspect_comm="x\x9b31m\r\nfake line"))
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in line)
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07 (pid 1234" in line
    assert "x\\x9b31m\\x0d\\x0afake line (pid 4321)" in line


def test_summaries_are_escaped_too_and_printable_unicode_is_kept():
    line = format_alert(alert(kind="request_slo", summary="req \x1b[31mé中 \u202egnp.exe"))
    assert "req \\x1b[31mé中 \\u202egnp.exe" in line


def test_printable_passes_ordinary_text_unchanged():
    from jitterscope.common.logs import printable

    text = "vLLM::EngineCore [bold] <b> ümlaut 日本 🙂 ~"
    assert printable(text) == text
    assert printable("\x00\x7f\x85") == "\\x00\\x7f\\x85"


# -- drain on stop: the comparison `up` waits on ------------------------------

from jitterscope.up import Quiet, parse_accounted, read_final, unstored  # noqa: E402

METRICS = """# HELP jitterscope_streams_records_accounted_total records stored or dead-lettered
# TYPE jitterscope_streams_records_accounted_total counter
jitterscope_streams_records_accounted_total{topic="jitterscope.runq"} 1500.0
jitterscope_streams_records_accounted_total{topic="jitterscope.collector_stats"} 7.0
# HELP jitterscope_streams_records_accounted_created records stored or dead-lettered
# TYPE jitterscope_streams_records_accounted_created gauge
jitterscope_streams_records_accounted_created{topic="jitterscope.runq"} 1.7e9
# HELP jitterscope_streams_records_total records decoded
# TYPE jitterscope_streams_records_total counter
jitterscope_streams_records_total{topic="jitterscope.runq"} 9999.0
"""


def test_accounted_counts_are_read_per_topic():
    assert parse_accounted(METRICS) == {"jitterscope.runq": 1500, "jitterscope.collector_stats": 7}


def test_a_worker_without_the_counter_is_told_apart_from_one_that_stored_nothing():
    assert parse_accounted("# HELP jitterscope_streams_records_total x\n"
                           "# TYPE jitterscope_streams_records_total counter\n") is None
    assert parse_accounted("# HELP jitterscope_streams_records_accounted_total x\n"
                           "# TYPE jitterscope_streams_records_accounted_total counter\n") == {}


def test_unstored_lists_each_topic_behind_and_nothing_else():
    sent = {"jitterscope.runq": 2000, "jitterscope.collector_stats": 7, "jitterscope.topology": 1}
    assert unstored(sent, {"jitterscope.runq": 1500, "jitterscope.collector_stats": 7}) == {
        "jitterscope.runq": 500, "jitterscope.topology": 1}


def test_more_accounted_than_sent_is_done():
    # a shared Kafka can hold records of earlier runs: >= is drained
    assert unstored({"jitterscope.runq": 10}, {"jitterscope.runq": 12, "jitterscope.pages": 3}) == {}
    assert unstored({}, {}) == {}


def test_final_file_is_read_or_none(tmp_path):
    path = tmp_path / "collector-final.json"
    assert read_final(path) is None  # crashed: no file
    path.write_text('{"host": "h", "boot_id": "b", "sent_by_topic": {"jitterscope.runq": 5}, '
                    '"undelivered": 2, "spooled": 0}')
    assert read_final(path)["sent_by_topic"] == {"jitterscope.runq": 5}
    assert read_final(path)["undelivered"] == 2
    path.write_text('{"host": "h", "sent_by_top')  # torn: unusable, treated as missing
    assert read_final(path) is None
    path.write_text('{"sent_by_topic": {"jitterscope.runq": "many"}}')
    assert read_final(path) is None


def test_without_final_counts_done_once_counts_stand_still():
    quiet = Quiet(5.0)
    assert not quiet.settled({"t": 1}, now=0.0)
    assert not quiet.settled({"t": 2}, now=3.0)  # still growing
    assert not quiet.settled({"t": 2}, now=7.9)
    assert quiet.settled({"t": 2}, now=8.0)
    assert not quiet.settled({"t": 3}, now=9.0)  # grew again: wait again


# -- folded stacks: one stack, one line ----------------------------------------

def test_folded_stacks_escape_every_line_break_unicode_knows():
    from jitterscope.reports.stacks import Stack, folded

    breaks = [chr(c) for c in range(0x110000) if len(f"a{chr(c)}b".splitlines()) > 1]
    assert {"\u2028", "\u2029", "\x85", "\r", "\x1c"} <= set(breaks)
    for brk in breaks:
        stack = Stack(1, f"vllm{brk}evil;frame 99", kernel=[f"schedule{brk}"], user=[f"main{brk}x", "loop"],
                      wait_ns=5_000_000)
        (line,) = folded([stack])
        assert len(line.splitlines()) == 1 and line.endswith(" 5000"), repr(line)
        assert line.count(";") == 3 and line.count(" ") == 1
    line = folded([Stack(1, "a\u2028b\u2029c\nd", [], [])])[0]
    assert line == "a\\u2028b\\u2029c\\x0ad 1"


def test_printable_escapes_the_unicode_line_separators():
    from jitterscope.common.logs import printable

    assert printable("jsvictim\u2028[critical] forged\u2029") == "jsvictim\\u2028[critical] forged\\u2029"
    assert len(printable("a\u2028b\u2029c\x85d").splitlines()) == 1
