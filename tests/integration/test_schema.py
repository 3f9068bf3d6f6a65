# SPDX-License-Identifier: Apache-2.0
"""The cluster variant of the DDL in deploy/ is current and is ClickHouse
that ClickHouse parses (chDB has no cluster to run it on; EXPLAIN AST parses
without executing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jitterscope.streams.clickhouse import cluster_ddl, split_statements

pytestmark = pytest.mark.integration

DEPLOYED = Path(__file__).resolve().parents[2] / "deploy/clickhouse-cluster/schema.sql"

PARSE = """
import json, sys, tempfile
import clickhouse_connect
client = clickhouse_connect.get_client(interface="chdb", path=tempfile.mkdtemp())
failed = []
for statement in json.load(sys.stdin):
    try:
        client.query("EXPLAIN AST " + statement)
    except Exception as exc:
        failed.append([statement[:120], str(exc)[:300]])
print(json.dumps(failed))
"""


def test_deployed_cluster_schema_is_generated_from_the_migrations():
    assert split_statements(DEPLOYED.read_text()) == cluster_ddl("{cluster}"), \
        "regenerate deploy/clickhouse-cluster/schema.sql with: jitterscope schema --cluster ''"


def test_every_cluster_statement_parses():
    statements = cluster_ddl("{cluster}")
    assert any("ReplicatedReplacingMergeTree" in s for s in statements)
    assert any("ENGINE = Distributed" in s for s in statements)
    assert all("ON CLUSTER" in s for s in statements)
    result = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(statements), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == []


RETENTION = """
import tempfile, time
from pathlib import Path
from jitterscope.schemas.events import RunqEvent
from jitterscope.streams import clickhouse
client = clickhouse.connect(None, Path(tempfile.mkdtemp()))
clickhouse.migrate(client)
clickhouse.apply_retention(client, {"runq_events": 2, "latency_minute": 30})
clickhouse.apply_retention(client, {"runq_events": 2})  # idempotent
now = time.time_ns()
rows = [RunqEvent(host="h", boot_id="b", seq=i, ts_ns=now - days * 86_400 * 10**9, pid=1, tid=1, comm="x",
                  cpu=0, wait_ns=1, suspect_pid=0, suspect_tid=0, suspect_comm="") for i, days in enumerate((0, 1, 3, 9))]
clickhouse.insert_records(client, "runq_events", rows)
client.command("OPTIMIZE TABLE jitterscope.runq_events FINAL")
print(sorted(r[0] for r in client.query("SELECT seq FROM jitterscope.runq_events").result_rows))
try:
    clickhouse.apply_retention(client, {"no_such_table": 3})
except Exception as exc:
    print(type(exc).__name__)
"""


def test_retention_is_configurable_per_table():
    result = subprocess.run([sys.executable, "-c", RETENTION], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["[0, 1]", "BadConfig"]
