# SPDX-License-Identifier: Apache-2.0
"""Daily use, as a newcomer meets it (issue 12): each error a user can hit is
one line with its fix and no traceback, and `jitterscope query` prints what
ClickHouse users and scripts expect. Every test runs the real command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jitterscope.broker import free_port
from jitterscope.common.settings import default_data_dir

pytestmark = pytest.mark.integration

# The CLI as another user. This venv's interpreter lives under /root, which
# that user cannot enter, so Python starts as root, imports what the commands
# need, and drops to the user before the command runs (as
# test_query_safety.py does).
AS_USER = """
import os, pwd, sys
import csv, encodings.idna, json, queue, unicodedata
import rich.markup, rich.table, rich.progress
import clickhouse_connect, chdb, bcc
import jitterscope.cli, jitterscope.doctor, jitterscope.query, jitterscope.topic_admin, jitterscope.reports.capacity
import jitterscope.collector.agent, jitterscope.collector.probes.base, jitterscope.streams.clickhouse
user = pwd.getpwnam(sys.argv[1])
os.setgroups([])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
sys.argv = ["jitterscope", *sys.argv[2:]]
jitterscope.cli.main()
"""


def env_for(data_dir: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    env.update(JITTERSCOPE_DATA_DIR=str(data_dir), JITTERSCOPE_COLLECTOR_METRICS_PORT="0", HOME="/", **extra)
    return env


def cli(*args: str, env: dict, user: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", AS_USER, user, *args] if user else [sys.executable, "-m", "jitterscope.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    """The command failed with ``code`` and said why in exactly one line."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jitterscope: "), lines
    return lines[0]


@pytest.fixture
def data_dir():
    path = Path(tempfile.mkdtemp(prefix="jitterscope-polish-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- errors that leaked or misled ---------------------------------------------

def test_doctor_as_a_user_names_the_fix_without_a_traceback(data_dir):
    result = cli("doctor", env=env_for(data_dir), user="nobody")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    out = " ".join(result.stdout.split())
    assert "FAIL privileges not root" in out and "fix: run as root (sudo jitterscope ...)" in out


def test_collector_as_a_user_says_it_needs_root_before_waiting_for_kafka(data_dir):
    started = time.monotonic()
    result = cli("collector", "--bootstrap-servers", f"127.0.0.1:{free_port()}", env=env_for(data_dir), user="nobody")
    line = one_line_error(result, 77)
    assert "not root" in line and "run as root" in line
    assert time.monotonic() - started < 30, "it waited for Kafka first"


def test_unreachable_kafka_is_one_line_naming_it_within_the_duration(data_dir):
    servers = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = cli("collector", "--bootstrap-servers", servers, "--duration", "1", env=env_for(data_dir))
    took = time.monotonic() - started
    line = one_line_error(result, 69)  # no librdkafka "%3|...|FAIL|" lines either
    assert f"Kafka at {servers}" in line and "cimpl" not in line
    assert took < 9, f"--duration 1 waited {took:.1f}s for Kafka (the default wait is 10-15 s)"


def test_doctor_with_kafka_unreachable_prints_its_checks_not_librdkafka(data_dir):
    servers = f"127.0.0.1:{free_port()}"
    result = cli("doctor", "--bootstrap-servers", servers, env=env_for(data_dir))
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert f"Kafka at {servers} unreachable" in " ".join(output.split())
    assert "|FAIL|" not in output and len(output.splitlines()) < 30, output[-2000:]


def test_report_checks_its_out_folder_before_building(data_dir):
    missing = data_dir / "missing" / "dir" / "r.html"
    line = one_line_error(cli("report", "--out", str(missing), env=env_for(data_dir)), 78)
    assert f"folder {missing.parent} does not exist" in line
    assert not (data_dir / "clickhouse").exists(), "the store was opened: the report was built first"
    line = one_line_error(cli("report", "--out", str(data_dir), env=env_for(data_dir)), 78)
    assert "is a directory" in line


def test_report_on_an_empty_store_renders_its_empty_sections(data_dir):
    out = data_dir / "r.html"
    result = cli("report", "--out", str(out), env=env_for(data_dir))
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    assert html.count("<section id=") >= 7 and "<h2>Tail latency trends</h2>" in html
    assert "no data yet" in result.stderr and "Traceback" not in result.stderr


def test_query_on_an_empty_store_says_how_to_get_data(data_dir):
    line = one_line_error(cli("query", "SELECT count() FROM jitterscope.runq_events", env=env_for(data_dir)), 66)
    assert "no data yet" in line and f"jitterscope up --data-dir {data_dir}" in line
    assert f"jitterscope synthetic-fleet --data-dir {data_dir}" in line
    assert "UNKNOWN_DATABASE" not in line


def test_a_mistyped_data_dir_is_no_data_and_creates_nothing(data_dir):
    typo = data_dir / "typo" / "data"
    for command in (["query", "SELECT count() FROM jitterscope.runq_events"], ["ledger"]):
        line = one_line_error(cli(*command, env=env_for(typo)), 66)
        assert "no data yet" in line and str(typo) in line, command
    plain = cli("query", "-f", "csv", "SELECT 6 * 7 AS answer", env=env_for(typo))  # SQL that needs no store still runs
    assert plain.returncode == 0 and "42" in plain.stdout, plain.stderr
    assert not (data_dir / "typo").exists(), "nothing made under a path that was never a store"


def test_a_user_querying_a_root_store_is_told_it_is_about_permissions(data_dir):
    """A store others may read (made before stores were 0700, or by hand):
    chDB must still lock it, which only its owner can."""
    from jitterscope.streams import clickhouse

    client = clickhouse.connect(None, data_dir)
    clickhouse.migrate(client)
    client.close()
    subprocess.run(["chmod", "-R", "a+rX", str(data_dir)], check=True)
    line = one_line_error(cli("query", "SELECT count() FROM jitterscope.alerts", env=env_for(data_dir), user="nobody"),
                          77)
    assert f"you cannot write to {data_dir / 'clickhouse'}" in line and "owns the store" in line
    assert "another process" not in line


def test_a_clickhouse_url_that_is_not_a_url_is_refused(data_dir):
    started = time.monotonic()
    line = one_line_error(cli("query", "--clickhouse-url", "notaurl", "SELECT 1", env=env_for(data_dir)), 78)
    assert "clickhouse_url" in line and "'notaurl' is not an http:// or https:// URL" in line
    assert time.monotonic() - started < 60


def test_config_file_mistakes_name_the_file(data_dir):
    env = env_for(data_dir)
    folder = data_dir / "conf.toml"
    folder.mkdir()
    assert f"config file {folder} is a directory" in one_line_error(cli("query", "--config", str(folder), "SELECT 1",
                                                                         env=env), 78)
    bad = data_dir / "bad.toml"
    bad.write_text('runq_alert_ms = 12\ntarget_comms = ["vllm*"\n')
    line = one_line_error(cli("query", "--config", str(bad), "SELECT 1", env=env), 78)
    assert f"config file {bad} is not valid TOML" in line and "line 2" in line
    line = one_line_error(cli("query", "SELECT 1", env={**env, "JITTERSCOPE_CONFIG": str(bad)}), 78)
    assert f"JITTERSCOPE_CONFIG file {bad}" in line


def test_list_settings_given_as_plain_text_say_they_are_json(data_dir):
    line = one_line_error(cli("query", "--set", "target_pids=1,2", "SELECT 1", env=env_for(data_dir)), 78)
    assert "target_pids" in line and "JSON" in line and "--set 'target_pids=[" in line


def test_synthetic_fleet_hints_name_the_data_dir_they_filled(data_dir):
    result = cli("synthetic-fleet", "--hosts", "4", "--events", "2000", "--hours", "2", "--data-dir", str(data_dir),
                 env=env_for(data_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert data_dir != default_data_dir()
    assert f"jitterscope query --saved worst-hosts --data-dir {data_dir}" in result.stdout
    assert f"jitterscope report --data-dir {data_dir}" in result.stdout


# -- query output ----------------------------------------------------------------

ROWS = ("SELECT number AS n, toDateTime('2026-01-02 03:04:05', 'UTC') AS t, "
        "toDateTime64('2026-01-02 03:04:05.250', 3, 'Asia/Tokyo') AS tokyo, "
        "if(number = 1, 'tab\there', repeat('x', 150)) AS s FROM numbers(2)")


def test_a_query_ending_in_format_gets_clickhouse_bytes(data_dir):
    env = env_for(data_dir)
    result = cli("query", "SELECT 1 AS a, 'x' AS b FORMAT TSVWithNames", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "a\tb\n1\tx\n"
    result = cli("query", "SELECT number AS n FROM numbers(2) format JSONEachRow", env=env)
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"n": 0}, {"n": 1}]
    line = one_line_error(cli("query", "-f", "csv", "SELECT 1 FORMAT TSV", env=env), 78)
    assert "FORMAT TSV" in line and "-f csv" in line
    # the guard still runs first: a FORMAT clause opens no way around it
    assert one_line_error(cli("query", f"SELECT 1 INTO OUTFILE '{data_dir}/x' FORMAT CSV", env=env), 65)
    assert not (data_dir / "x").exists()


def test_an_empty_result_keeps_its_header_and_says_zero_rows(data_dir):
    env = env_for(data_dir)
    empty = "SELECT 1 AS a, 'b' AS b WHERE 0"
    for fmt, header in (("csv", "a,b\n"), ("tsv", "a\tb\n"), ("json", "[]\n"), ("ndjson", "")):
        result = cli("query", "-f", fmt, empty, env=env)
        assert result.returncode == 0 and result.stdout == header, (fmt, result.stdout, result.stderr)
        assert result.stderr.strip() == "0 rows", (fmt, result.stderr)
    table = cli("query", empty, env=env)
    assert "┃ a ┃ b ┃" in table.stdout and table.stderr.strip() == "0 rows"


def test_piped_tables_keep_their_width_and_timestamps_carry_utc(data_dir):
    result = cli("query", ROWS, env=env_for(data_dir))
    assert result.returncode == 0, result.stderr
    assert "x" * 150 in result.stdout, "a piped table was cut"
    assert "2026-01-02T03:04:05Z" in result.stdout and "2026-01-01T18:04:05.250000Z" in result.stdout


def test_csv_tsv_json_and_ndjson_agree(data_dir):
    env = env_for(data_dir)
    expected = [{"n": 0, "t": "2026-01-02T03:04:05Z", "tokyo": "2026-01-01T18:04:05.250000Z", "s": "x" * 150},
                {"n": 1, "t": "2026-01-02T03:04:05Z", "tokyo": "2026-01-01T18:04:05.250000Z", "s": "tab\there"}]
    assert json.loads(cli("query", "-f", "json", ROWS, env=env).stdout) == expected
    ndjson = cli("query", "-f", "ndjson", ROWS, env=env).stdout.splitlines()
    assert [json.loads(line) for line in ndjson] == expected
    tsv = cli("query", "-f", "tsv", ROWS, env=env).stdout.splitlines()
    assert tsv[0] == "n\tt\ttokyo\ts"
    assert tsv[2] == "1\t2026-01-02T03:04:05Z\t2026-01-01T18:04:05.250000Z\ttab\\there"  # ClickHouse's escaping
    csv_lines = cli("query", "-f", "csv", ROWS, env=env).stdout.splitlines()
    assert csv_lines[0] == "n,t,tokyo,s" and csv_lines[2] == "1,2026-01-02T03:04:05Z,2026-01-01T18:04:05.250000Z,tab\there"


def test_a_saved_query_names_the_valid_values_of_a_parameter(data_dir):
    line = one_line_error(cli("query", "--saved", "worst-hosts", "-p", "probe=foo", env=env_for(data_dir)), 78)
    assert "probe='foo'" in line and "runq" in line and "gpu_ioctl" in line


def test_format_and_timestamps_through_a_running_worker(stack):
    """While a streams worker holds the store, `query` goes through its
    /query page: same bytes for FORMAT, same ISO 8601 UTC timestamps."""
    stack.start_worker()
    result = cli("query", "SELECT 1 AS a, 'x' AS b FORMAT TSVWithNames", env=stack.env)
    assert result.returncode == 0 and result.stdout == "a\tb\n1\tx\n", result.stderr
    rows = json.loads(cli("query", "-f", "json", ROWS, env=stack.env).stdout)
    assert rows[0]["t"] == "2026-01-02T03:04:05Z" and rows[1]["tokyo"] == "2026-01-01T18:04:05.250000Z"
    result = cli("query", "-f", "csv", "SELECT 1 AS a WHERE 0", env=stack.env)
    assert result.stdout == "a\n" and result.stderr.strip() == "0 rows"


def test_up_knows_a_store_from_an_earlier_run(data_dir):
    """A store outlives the checkout that made it: `up` says so at start."""
    from jitterscope.common.settings import Settings
    from jitterscope.streams import clickhouse
    from jitterscope.up import has_earlier_store

    settings = Settings(host="h", data_dir=data_dir)
    assert not has_earlier_store(settings)
    client = clickhouse.connect(None, data_dir)
    clickhouse.migrate(client)  # what a first `up` leaves behind
    client.close()
    assert has_earlier_store(settings)
    assert not has_earlier_store(settings.model_copy(update={"clickhouse_url": "http://ch:8123"}))
