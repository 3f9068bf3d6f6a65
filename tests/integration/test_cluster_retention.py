# SPDX-License-Identifier: Apache-2.0
"""retention_days on a ClickHouse cluster: the TTL goes to the Replicated
``*_local`` tables ON CLUSTER (the Distributed tables hold no rows), and the
statements are ClickHouse that ClickHouse parses (EXPLAIN AST in chDB, which
has no cluster to run them on)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from jitterscope.streams.clickhouse import DATABASE, RETAINABLE, cluster_ddl, retention_statements

pytestmark = pytest.mark.integration

PARSE = """
import json, sys, tempfile
import clickhouse_connect
client = clickhouse_connect.get_client(interface="chdb", path=tempfile.mkdtemp())
out = []
for statement in json.load(sys.stdin):
    try:
        out.append(client.query("EXPLAIN AST " + statement).result_rows[0][0].strip())
    except Exception as exc:
        out.append("FAILED: " + str(exc)[:300])
print(json.dumps(out))
"""


def test_cluster_retention_targets_the_local_tables_on_cluster_and_parses():
    days = {**{t: 30 for t in RETAINABLE}, "latency_minute": 400, "attribution_minute": 0, "runq_events": 0}
    statements = retention_statements(days, "fleet")
    assert len(statements) == len(days)
    targets = {}
    for s in statements:
        m = re.fullmatch(rf"ALTER TABLE {DATABASE}\.(\w+) ON CLUSTER 'fleet' (MODIFY TTL .*|REMOVE TTL)", s)
        assert m, s
        targets[m[1]] = m[2]
    assert targets.keys() == {f"{t}_local" for t in days}
    assert targets["runq_events_local"] == "REMOVE TTL"
    assert targets["latency_minute_local"] == "MODIFY TTL toDateTime(minute) + INTERVAL 400 DAY"
    # every target is a replicated table the cluster DDL creates (not its Distributed twin)
    created = {m[1]: m[2] for s in cluster_ddl("fleet")
               if (m := re.match(rf"CREATE TABLE IF NOT EXISTS {DATABASE}\.(\w+) ON CLUSTER .*?ENGINE = (\w+)", s, re.S))}
    assert all(created[t].startswith("Replicated") for t in targets), created

    result = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(statements), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    asts = json.loads(result.stdout)
    assert not [a for a in asts if a.startswith("FAILED")], asts
    assert all("AlterQuery" in a for a in asts)


def test_single_node_retention_is_unchanged():
    assert retention_statements({"runq_events": 2}) == [
        f"ALTER TABLE {DATABASE}.runq_events MODIFY TTL toDateTime(ts) + INTERVAL 2 DAY"]
