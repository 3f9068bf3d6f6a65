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
