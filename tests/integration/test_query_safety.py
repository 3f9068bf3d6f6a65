# SPDX-License-Identifier: Apache-2.0
"""Query safety against a real streams worker, as root and as `nobody`: user
SQL only reads, and only the store's owner may query it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jitterscope.streams.worker_state import state_file

# runs as root (like the whole suite: `make test` in CI), acting as root and as nobody
pytestmark = pytest.mark.integration

VICTIM_TEXT = "root's secret\n"


# The CLI as another user. This venv's interpreter may live under /root, which
# that user cannot enter, so Python starts as root, imports what the command
# needs, and drops to the user before the command runs.
AS_USER = """
import os, pwd, sys
import jitterscope.cli, jitterscope.query, jitterscope.reports.queries, jitterscope.common.settings
user = pwd.getpwnam(sys.argv[1])
os.setgroups([])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
sys.argv = ["jitterscope", *sys.argv[2:]]
jitterscope.cli.main()
"""


def cli(*args: str, env: dict, user: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "jitterscope.cli", *args]
    if user:
        command = [sys.executable, "-c", AS_USER, user, *args]
    result = subprocess.run(command, env={**env, "COLUMNS": "500"}, capture_output=True, text=True, timeout=180,
                            cwd="/")
    result.output = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines
    return result


def post(port: int, sql: str, token: str | None, parameters: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/query", method="POST", headers=headers,
                                     data=json.dumps({"sql": sql, "parameters": parameters or {}}).encode())
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def curl_as_nobody(url: str, sql: str | None = None, token: str | None = None) -> int:
    command = ["runuser", "-u", "nobody", "--", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
               "--max-time", "120"]
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    if sql is not None:
        command += ["-X", "POST", "-H", "Content-Type: application/json", "--data", json.dumps({"sql": sql})]
    return int(subprocess.run([*command, url], capture_output=True, text=True, timeout=180, cwd="/").stdout)


@pytest.fixture(scope="module")
def targets():
    """A root-only 0700 directory and two root-owned 0600 files in it."""
    folder = Path(tempfile.mkdtemp(prefix="jitterscope-root-only-"))
    assert folder.stat().st_mode & 0o777 == 0o700
    victims = [folder / "append-victim", folder / "truncate-victim"]
    for victim in victims:
        victim.write_text(VICTIM_TEXT)
        victim.chmod(0o600)
    yield folder, victims
    shutil.rmtree(folder)


def untouched(folder: Path, victims: list[Path]) -> None:
    assert sorted(folder.iterdir()) == sorted(victims)
    for victim in victims:
        assert victim.read_text() == VICTIM_TEXT
        assert victim.stat().st_mode & 0o777 == 0o600


def attacks(folder: Path, victims: list[Path]) -> list[str]:
    return [f"SELECT 'x' INTO OUTFILE '{folder}/created'",
            f"SELECT 'x' INTO OUTFILE '{victims[0]}' APPEND",
            f"SELECT 'x' INTO OUTFILE '{victims[1]}' TRUNCATE",
            f"sEleCt 'x' /* */ into/**/outfile '{folder}/created'",
            f"SELECT file('{victims[0]}')",
            f"INSERT INTO FUNCTION file('{folder}/created', 'CSV') SELECT 1",
            # ClickHouse reads // as a comment to the end of the line: a quote in it hid the next line
            f"SELECT 1 // '\n, file('{victims[0]}') AS leaked -- '",
            f"SELECT 1 // '\n; SELECT 'x' INTO OUTFILE '{victims[1]}' TRUNCATE FORMAT RawBLOB; SELECT 2 -- '"]


@pytest.fixture(scope="module")
def worker(stack):
    """A worker whose data directory others may traverse (as a hand-made
    /var/lib/jitterscope would be): the state file's own mode is what keeps
    the token from them."""
    data_dir = Path(tempfile.mkdtemp(prefix="jitterscope-query-safety-"))
    data_dir.chmod(0o755)
    stack.data_dir = data_dir
    stack.env["JITTERSCOPE_DATA_DIR"] = str(data_dir)
    proc = stack.start_worker()
    info = json.loads(state_file(data_dir).read_text())
    yield stack, info["token"]
    proc.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def test_state_file_and_store_are_for_the_owner_only(worker):
    stack, token = worker
    path = state_file(stack.data_dir)
    assert path.stat().st_mode & 0o777 == 0o600
    assert (stack.data_dir / "clickhouse").stat().st_mode & 0o777 == 0o700
    assert len(token) >= 32
    assert not [p for p in stack.data_dir.iterdir() if p.name.startswith(f".{path.name}")]  # no temp file left


def test_root_with_the_token_runs_a_select(worker):
    stack, token = worker
    assert post(stack.web_port, "SELECT 1 AS one", token) == (200, {"columns": ["one"], "rows": [[1]]})
    assert stack.query("SELECT {n:UInt8} + 1", n=1) == [[2]]
    result = cli("query", "--format", "json", "SELECT count() AS n FROM system.one", env=stack.env)
    assert result.returncode == 0, result.output
    assert json.loads(result.stdout) == [{"n": 1}]


def test_root_with_the_token_cannot_write_or_read_files(worker, targets):
    stack, token = worker
    folder, victims = targets
    for sql in attacks(folder, victims):
        status, body = post(stack.web_port, sql, token)
        assert status == 400 and body["error"].startswith("refused: "), (sql, status, body)
        result = cli("query", sql, env=stack.env)
        assert result.returncode == 65 and "refused: " in result.output, (sql, result.output)
    # a parameter value that closes the string literal it is placed in
    status, body = post(stack.web_port, f"SELECT 1, '%(x)s{folder}/created'", token, {"x": "INTO OUTFILE"})
    assert status == 400 and "INTO OUTFILE" in body["error"]
    untouched(folder, victims)


def test_nobody_without_the_token_is_refused(worker, targets):
    stack, token = worker
    folder, victims = targets
    url = f"http://127.0.0.1:{stack.web_port}"
    for sql in [*attacks(folder, victims), "SELECT comm, cmdline FROM jitterscope.processes"]:
        assert curl_as_nobody(f"{url}/query", sql) == 401
        assert curl_as_nobody(f"{url}/query", sql, token="guessed") == 403
    assert curl_as_nobody(f"{url}/metrics") == 200
    untouched(folder, victims)


def test_nobody_running_jitterscope_query_gets_a_clear_error(worker):
    stack, _token = worker
    env = {**stack.env, "HOME": "/"}
    result = cli("query", "SELECT count() FROM jitterscope.processes", env=env, user="nobody")
    assert result.returncode == 77, result.output
    assert f"you cannot read {state_file(stack.data_dir)}" in result.output
    assert "another process" not in result.output


def test_local_query_without_a_worker_refuses_attacks(targets):
    folder, victims = targets
    data_dir = Path(tempfile.mkdtemp(prefix="jitterscope-query-local-"))
    data_dir.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    env.update(JITTERSCOPE_DATA_DIR=str(data_dir), HOME="/")
    try:
        for sql in attacks(folder, victims):
            result = cli("query", sql, env=env)
            assert result.returncode == 65 and "refused: " in result.output, (sql, result.output)
        result = cli("query", "--format", "json", "SELECT 41 + 1 AS n", env=env)
        assert result.returncode == 0 and json.loads(result.stdout) == [{"n": 42}], result.output
        assert not (data_dir / "clickhouse").exists(), "a query makes no store where there was none"
        from jitterscope.streams import clickhouse
        clickhouse.connect(None, data_dir).close()  # the store, as the worker makes it
        assert (data_dir / "clickhouse").stat().st_mode & 0o777 == 0o700
        result = cli("query", "SELECT 1", env=env, user="nobody")
        assert result.returncode == 77, result.output
        assert f"you cannot read {data_dir / 'clickhouse'}" in result.output
        untouched(folder, victims)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# Typed Identifier parameters are names ClickHouse writes into the statement:
# the guard must see them in place (issue 40, item 11).
CREDENTIALS_BY_IDENTIFIER = [
    ("SELECT * FROM {t:Identifier}", {"t": "system.named_collections"}),
    ("SELECT * FROM {d:Identifier}.{t:Identifier}", {"d": "system", "t": "named_collections"}),
    ("SELECT * FROM system.{t:Identifier}", {"t": "named_collections"}),
    ("SELECT * FROM {d:Identifier}.named_collections", {"d": "system"}),
]


def test_identifier_parameters_cannot_name_the_credentials(worker):
    stack, token = worker
    for sql, parameters in CREDENTIALS_BY_IDENTIFIER:
        status, body = post(stack.web_port, sql, token, parameters)
        assert status == 400 and body["error"].startswith("refused: system.named_collections holds credentials"), \
            (sql, parameters, status, body)
        params = [arg for name, value in parameters.items() for arg in ("--param", f"{name}={value}")]
        result = cli("query", *params, sql, env=stack.env)
        assert result.returncode == 65 and "named_collections holds credentials" in result.output, result.output
    status, body = post(stack.web_port, "SELECT * FROM {t:Identifier}", token, {"t": "x; DROP"})
    assert status == 400 and "not a plain name" in body["error"] and "jitterscope.alerts" in body["error"]


def test_identifier_parameters_still_name_jitterscope_tables(worker):
    stack, token = worker
    status, body = post(stack.web_port, "SELECT count() AS n FROM {d:Identifier}.{t:Identifier}", token,
                        {"d": "jitterscope", "t": "alerts"})
    assert status == 200 and body["columns"] == ["n"], body
    # one name holding a dot: the guard lets it through; this ClickHouse looks it up as one name
    status, body = post(stack.web_port, "SELECT count() AS n FROM {t:Identifier}", token, {"t": "jitterscope.alerts"})
    assert not body.get("error", "").startswith("refused"), body
    result = cli("query", "--format", "json", "--param", "d=jitterscope", "--param", "t=alerts",
                 "SELECT count() AS n FROM {d:Identifier}.{t:Identifier}", env=stack.env)
    assert result.returncode == 0 and "n" in json.loads(result.stdout)[0], result.output
