# SPDX-License-Identifier: Apache-2.0
"""Saved fleet queries over a synthetic fleet with known answers (300 hosts,
2 million run-queue events, injected root causes), in the embedded
ClickHouse, through the CLI as a user runs them."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser

import pytest

from jitterscope.reports import queries, synthetic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("fleet")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    env["JITTERSCOPE_DATA_DIR"] = str(data_dir)
    loaded = subprocess.run([sys.executable, "-m", "jitterscope.cli", "synthetic-fleet"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    return env


def saved(env, name: str, *params: str) -> list[dict]:
    args = [sys.executable, "-m", "jitterscope.cli", "query", "--saved", name, "-f", "json"]
    for p in params:
        args += ["-p", p]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_worst_hosts_by_p999(fleet):
    rows = saved(fleet, "worst-hosts", "since=24h", "limit=5")
    assert rows[0]["host"] == synthetic.WORST_RUNQ_HOST
    assert rows[0]["p999_ms"] > 20 * rows[1]["p999_ms"]
    assert len(rows) == 5


def test_slo_breaches_by_cause(fleet):
    rows = saved(fleet, "slo-by-cause")
    assert [r["cause"] for r in rows] == synthetic.SLO_CAUSES


def test_the_cause_that_took_each_phase(fleet):
    rows = saved(fleet, "phase-causes")
    assert [(r["phase"], r["cause"], r["top_culprit"]) for r in rows] == [
        ("queue", "runq_starvation", synthetic.NOISY_NEIGHBOUR), ("decode", "gpu_ioctl_stall", "UVM_MAP")]
    assert rows[0]["requests"] > 2000 and rows[1]["requests"] > 800  # ~3,000 and ~1,200 of the 200,000
    assert rows[0]["share_of_phase"] == 0.83 and rows[0]["taken_s"] == round(rows[0]["requests"] * 0.5, 2)


def test_the_serving_engines_worst_minutes_beside_the_causes(fleet):
    rows = saved(fleet, "serving-vs-causes", "limit=5")
    assert [(r["host"], r["ttft_p99_ms"], r["model"]) for r in rows] == [(synthetic.WORST_RUNQ_HOST, 2000.0, "llama-8b")] * 5
    assert all(r["requests_waiting"] == 40 for r in rows)


def test_noisy_neighbours(fleet):
    rows = saved(fleet, "noisy-neighbours", "limit=10")
    assert rows[0]["command"] == synthetic.NOISY_NEIGHBOUR
    # a serving process others waited behind (100 s of a hog's waits) is protected, never a neighbour
    assert synthetic.SERVING_COMM not in [r["command"] for r in rows]
    assert synthetic.HOSTILE_COMM in [r["command"] for r in rows], "stored and returned verbatim, as data"


def test_off_node_hosts(fleet):
    assert sorted({r["host"] for r in saved(fleet, "off-node")}) == synthetic.OFF_NODE_HOSTS


def test_migration_storms(fleet):
    rows = saved(fleet, "migration-storms")
    assert (rows[0]["host"], rows[0]["tid"]) == (synthetic.STORM_HOST, synthetic.STORM_TID)
    assert all(r["worst_per_s"] >= 50 for r in rows)


def test_pcie_contention(fleet):
    rows = saved(fleet, "pcie-contention")
    assert (rows[0]["host"], rows[0]["neighbour"]) == (synthetic.PCIE_HOST, synthetic.PCIE_NEIGHBOUR)
    assert rows[0]["incidents"] == 50


def test_recurring_causes_have_their_period_phase_and_culprit(fleet):
    rows = saved(fleet, "recurring-causes", "since=24h")
    top = next(r for r in rows if r["cause"] == "runq_starvation")
    assert (top["host"], top["cause"], top["culprit"], top["period_s"], top["phase_s"]) == (
        synthetic.RECURRING_HOST, "runq_starvation", synthetic.RECURRING_CULPRIT, synthetic.RECURRING_PERIOD_MIN * 60,
        synthetic.RECURRING_PHASE_MIN * 60)
    assert top["regularity"] >= 0.95 and top["occurrences"] >= 90
    # its memory side recurs too, though each run is a new pid: keyed by its command and unit
    memory = [r for r in rows if r["cause"] == "memory_stall"]
    assert [(r["host"], r["culprit"], r["period_s"], r["phase_s"]) for r in memory] == [
        (synthetic.RECURRING_HOST, f"{synthetic.RECURRING_CULPRIT} ({synthetic.RECURRING_UNIT})",
         synthetic.RECURRING_PERIOD_MIN * 60, synthetic.RECURRING_PHASE_MIN * 60)], rows[:5]
    assert memory[0]["occurrences"] >= 90 and memory[0]["last_instance"].startswith(
        f"{synthetic.RECURRING_CULPRIT} (pid 5")  # the last run's process, for the drill-down
    # the fleet's random neighbours (logrotate on every host) never come back on a schedule
    assert all(r["culprit"].startswith(synthetic.RECURRING_CULPRIT) for r in rows), rows[:5]
    # read on a coarser clock (5-minute steps), the same schedule keeps its period
    coarse = saved(fleet, "recurring-causes", "since=24h", "step_s=300")
    assert {(r["cause"], r["culprit"], r["period_s"]) for r in coarse} == {
        (r["cause"], r["culprit"], r["period_s"]) for r in rows}, coarse[:5]


def test_parameters_are_bound_not_pasted(fleet):
    hostile = "h100-001' OR 1=1 --"
    assert saved(fleet, "ledger", f"host={hostile}") == []  # no such host: no rows, no injection
    refused = subprocess.run([sys.executable, "-m", "jitterscope.cli", "query", "--saved", "worst-hosts", "-p",
                              "probe=runq' OR 1=1 --"], env=fleet, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 78 and "runq, gpu_ioctl" in refused.stderr  # a closed set names its values


def test_bad_saved_query_use_is_one_clear_line(fleet):
    for args, expect in ((["--saved", "nope"], "no saved query"), (["--saved", "worst-hosts", "-p", "color=red"], "takes"),
                         (["--saved", "worst-hosts", "-p", "since=soon"], "duration"),
                         (["SELECT {c:UInt32} AS c"], "-p c=VALUE")):  # a parameter with no value: how to give it
        result = subprocess.run([sys.executable, "-m", "jitterscope.cli", "query", *args], env=fleet,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 78 and expect in result.stderr and "Traceback" not in result.stderr


def test_every_saved_query_is_tested():
    tested = {"worst-hosts", "slo-by-cause", "phase-causes", "serving-vs-causes", "noisy-neighbours", "off-node", "migration-storms", "pcie-contention",
              "recurring-causes", "ledger"}  # ledger: tests/integration/test_ledger.py
    assert set(queries.SAVED) == tested


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--enable-logging=stderr", "--log-level=0"]


def test_capacity_report_renders_in_chromium(fleet, tmp_path):
    from datetime import datetime, timedelta, timezone

    from jitterscope.reports.capacity import SECTIONS

    out = tmp_path / "report.html"
    remediation = "now-12h"  # half-way through the synthetic fleet's 24 h, as the README writes it
    built = subprocess.run([sys.executable, "-m", "jitterscope.cli", "report", "--since", "2d", "--out", str(out),
                            "--remediation-date", remediation], env=fleet, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    html = out.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html.split("<body>")[0]

    rendered = subprocess.run([*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    dom = rendered.stdout
    console_errors = [line for line in rendered.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console_errors == []
    for key, title in SECTIONS:
        assert f'id="{key}"' in dom and title in dom, key
    # the hostile process name is text on the page, never markup
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in dom
    assert "<script>alert" not in dom and "<script" not in dom
    # the injected answers are what the report leads with
    assert synthetic.WORST_RUNQ_HOST in dom and synthetic.NOISY_NEIGHBOUR in dom
    _check_summary(dom)
    assert "Request P999" in dom and "→" in dom
    assert "Processes using GPUs" in dom and "0-63" in dom and ">200<" in dom and ">100<" in dom


def _items(dom: str, section: str, cls: str) -> list[str]:
    """The text of each <li> of the list of class ``cls`` in section ``section`` of the rendered DOM."""
    part = dom.split(f'id="{section}"')[1].split("</section>")[0]
    found = re.search(rf'<(?:ul|ol) class="{cls}">(.*?)</(?:ul|ol)>', part, re.S)
    assert found, (section, cls)
    return [" ".join(unescape(re.sub(r"<[^>]+>", "", li.replace("<br>", " "))).split())
            for li in re.findall(r"<li>(.*?)</li>", found.group(1), re.S)]


def _check_summary(dom: str) -> None:
    """The report leads with the answer (issue 20): the period as given,
    then a summary before every other section naming the injected worst
    hosts, the causes by cost and the first three of the ranked actions;
    and the trend charts' lines that lie on one another are said to."""
    assert "covering the last 2d (" in dom and "days" not in dom.split("<section")[0]
    sections = re.findall(r'<section id="([a-z-]+)"', dom)
    assert sections[0] == "summary", sections
    hosts = _items(dom, "summary", "worst-hosts")
    assert hosts[0].startswith(synthetic.WORST_RUNQ_HOST + ": run-queue P999"), hosts
    assert any(h.startswith(synthetic.RECURRING_HOST) and synthetic.RECURRING_CULPRIT in h for h in hosts), hosts
    causes = _items(dom, "summary", "top-causes")
    assert [c.split(":")[0] for c in causes[:3]] == synthetic.SLO_CAUSES and " s of excess" in causes[0]
    assert causes[3].startswith(f"neighbour {synthetic.NOISY_NEIGHBOUR}: ") and "300 host(s)" in causes[3], causes
    first_three = _items(dom, "summary", "actions")
    assert len(first_three) == 3 and first_three == _items(dom, "actions", "actions")[:3]
    assert synthetic.NOISY_NEIGHBOUR in first_three[0]
    assert not [a for a in _items(dom, "actions", "actions") if synthetic.SERVING_COMM in a], "a server is never moved"
    trends = dom.split('id="trends"')[1].split("</section>")[0]
    notes = " ".join(re.findall(r'<p class="note">(.*?)</p>', trends, re.S))
    for drawn, other in re.findall(r">([^<>]+) \(= ([^<>]+)\)</text>", trends):
        assert f"{drawn} lies on {other}" in notes, (drawn, other, notes)
    assert "h100 worst host P999" in trends and "h100 worst host P999 (=" not in trends, "the worst host stands out"


def test_every_grafana_panel_query_runs_on_the_fleet(fleet):
    """The dashboard's SQL, with Grafana's macros expanded as the ClickHouse
    data source expands them, answers from the same tables."""
    from tests.grafana import panel_sql, panels

    assert panels()
    for panel in panels():
        result = subprocess.run([sys.executable, "-m", "jitterscope.cli", "query", "-f", "json", panel_sql(panel)],
                                env=fleet, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (panel["title"], result.stderr)
        if panel["id"] not in (2, 9, 10, 11):  # no GPU driver histograms, collector stats or own waits in it
            assert json.loads(result.stdout), panel["title"]


class _Charts(HTMLParser):
    """The report's SVG charts as Chromium rendered them: per <svg>, its
    viewBox, classes, axes (scale and tick values) and every <text> with
    its position, anchor, font size and content."""

    def __init__(self):
        super().__init__()
        self.charts: list[dict] = []
        self._axis: dict | None = None
        self._text: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.charts.append({"class": a.get("class", ""), "width": float(a["viewbox"].split()[2]),
                                "height": float(a["viewbox"].split()[3]), "axes": {}, "texts": []})
        elif tag == "g" and "axis" in a.get("class", "").split():
            name = a["class"].split()[1]
            self._axis = self.charts[-1]["axes"][name] = {"scale": a["data-scale"], "ticks": [], "labels": []}
        elif tag == "text":
            self._text = {"x": float(a["x"]), "y": float(a["y"]), "size": float(a["font-size"]),
                          "anchor": a.get("text-anchor", "start"), "rotated": "transform" in a, "content": "",
                          "tick": a.get("class") == "tick", "value": a.get("data-value")}

    def handle_data(self, data):
        if self._text is not None:
            self._text["content"] += data

    def handle_endtag(self, tag):
        if tag == "text" and self._text is not None:
            t, self._text = self._text, None
            self.charts[-1]["texts"].append(t)
            if self._axis is not None and t["tick"]:
                self._axis["labels"].append(t["content"])
                if t["value"] is not None:
                    self._axis["ticks"].append(float(t["value"]))
        elif tag == "g":
            self._axis = None


def test_report_charts_have_axes_log_latency_a_heatmap_and_text_that_fits(fleet, tmp_path):
    """Read back from the DOM Chromium rendered: every chart has ticks on
    both axes, latency axes are log scales on powers of 10 or 2, the
    against-load charts count requests on x, every host class has a heatmap,
    and no text runs out of its chart (width estimated from its characters)."""
    from jitterscope.reports.charts import CHAR_W

    out = tmp_path / "report.html"
    built = subprocess.run([sys.executable, "-m", "jitterscope.cli", "report", "--since", "2d", "--out", str(out)],
                           env=fleet, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    rendered = subprocess.run([*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri()],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    parser = _Charts()
    parser.feed(rendered.stdout)
    charts = parser.charts
    heatmaps = [c for c in charts if "heatmap" in c["class"]]
    bars = [c for c in charts if "bars" in c["class"]]
    lines = [c for c in charts if c not in heatmaps and c not in bars]
    assert len(heatmaps) == 2, "one heatmap per host class (a100, h100)"
    assert len(bars) == 2 and len(lines) == 4, "trends, contention, and pressure against load for each class"

    for chart in charts:
        x, y = chart["axes"]["x"], chart["axes"]["y"]
        assert len(x["ticks"]) >= 3, (chart["class"], x)
        if chart in bars:
            assert y["labels"] and all(y["labels"]), "every bar is named"
        else:
            assert len(y["ticks"]) >= 3, (chart["class"], y)
            assert y["scale"] == "log", "latency on a log scale"
            for value in y["ticks"]:
                assert any(math.isclose(math.log(value, base), round(math.log(value, base)), abs_tol=1e-6)
                           for base in (10, 2)), f"tick {value} is no power of 10 or 2"
        assert x["ticks"] == sorted(x["ticks"]) and y["ticks"] == sorted(y["ticks"])
        for t in chart["texts"]:
            width = len(t["content"]) * t["size"] * CHAR_W
            if t["rotated"]:
                assert width / 2 <= t["y"] and t["y"] + width / 2 <= chart["height"], t
                continue
            left = t["x"] - {"start": 0, "middle": width / 2, "end": width}[t["anchor"]]
            assert 0 <= left and left + width <= chart["width"], f"text runs out of its chart: {t}"
            assert t["size"] <= t["y"] <= chart["height"], t

    against_load = lines[2:]
    for chart in against_load:
        assert chart["axes"]["x"]["scale"] == "linear" and max(chart["axes"]["x"]["ticks"]) >= 1000, "requests/hour"
        assert all(re.fullmatch(r"[0-9.]+k?", label) for label in chart["axes"]["x"]["labels"])
    # the trend chart names its four lines, each in its own colour and dash
    # (lines that lie on another say so: the synthetic classes have equal P99 and P999)
    legend = [t["content"].split(" (= ")[0] for t in lines[0]["texts"] if re.match(r"[ah]100 P99", t["content"])]
    assert sorted(legend) == ["a100 P99", "a100 P999", "h100 P99", "h100 P999"]
    # bar labels whole: the value and its unit, never cut
    assert any(t["content"] == "2,494.8 s" for t in bars[0]["texts"])
    assert any(t["content"] == "<script>alert('x')</script>" for t in bars[1]["texts"]), "escaped, shown whole"
