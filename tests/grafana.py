# SPDX-License-Identifier: Apache-2.0
"""The shipped Grafana dashboard's panels and their SQL with Grafana's
macros expanded as the ClickHouse data source expands them, for the tests
that run it against a real store (tests/integration/test_fleet.py, a
synthetic fleet; tests/integration/test_docs_examples.py, a real `up` run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1] / "deploy/grafana"


def panels() -> list[dict]:
    return json.loads((DEPLOY / "jitterscope.json").read_text())["panels"]


def panel_sql(panel: dict) -> str:
    """The panel's query over the last day, in 5-minute buckets."""
    sql = panel["targets"][0]["rawSql"]
    sql = re.sub(r"\$__timeFilter\((\w+)\)", r"\1 >= now() - INTERVAL 1 DAY", sql)
    sql = re.sub(r"\$__timeInterval\((\w+)\)", r"toStartOfInterval(\1, INTERVAL 5 minute)", sql)
    assert "$__" not in sql, sql
    return sql
