# SPDX-License-Identifier: Apache-2.0
"""The Grafana files as shipped (deploy/grafana/): the provisioning files
point Grafana at the dashboard and at a data source of the plugin type its
panels use, with the connection keys the ClickHouse plugin documents. Their
SQL runs against real stores in tests/integration/test_fleet.py and
test_docs_examples.py; no Grafana runs here."""

from __future__ import annotations

import yaml

from tests.grafana import DEPLOY, panels


def test_the_provisioned_data_source_is_the_one_the_panels_ask_for():
    (source,) = yaml.safe_load((DEPLOY / "provisioning/datasources/jitterscope.yaml").read_text())["datasources"]
    assert {p["datasource"]["type"] for p in panels()} == {source["type"]} == {"grafana-clickhouse-datasource"}
    assert {"host", "port", "protocol", "username"} <= set(source["jsonData"])
    assert source["jsonData"]["protocol"] in ("native", "http") and source["jsonData"]["defaultDatabase"] == "jitterscope"
    assert set(source["secureJsonData"]) == {"password"}  # a secret, never in jsonData


def test_the_dashboard_provider_loads_files_and_every_panel_has_one_sql_target():
    (provider,) = yaml.safe_load((DEPLOY / "provisioning/dashboards/jitterscope.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        (target,) = panel["targets"]
        assert target["queryType"] == "sql" and target["rawSql"].lstrip().upper().startswith("SELECT"), panel["title"]
        assert "jitterscope." in target["rawSql"], panel["title"]  # tables named with their database
