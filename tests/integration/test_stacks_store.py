# SPDX-License-Identifier: Apache-2.0
"""Stacks in the store (real chDB): the culprit ranking adds waits up across
hosts by stack id, one alert's stacks, folded output, and the report section
escapes frames."""

from __future__ import annotations

import time

import pytest

from jitterscope import stacks as stacks_cmd
from jitterscope.collector.stacks import stack_id
from jitterscope.reports import stacks as store
from jitterscope.schemas import events
from jitterscope.streams import clickhouse

pytestmark = pytest.mark.integration

MS = 1_000_000
HOG = (["jitterscope_hog_spin", "main"], ["__schedule", "schedule"])
OTHER = (["<script>alert(1)</script>", "main"], [])


@pytest.fixture(scope="module")
def query(tmp_path_factory):
    client = clickhouse.connect(None, tmp_path_factory.mktemp("store"))
    clickhouse.migrate(client)
    now = time.time_ns()
    hog_id, other_id = stack_id("hog", HOG[1], HOG[0]), stack_id("evil", OTHER[1], OTHER[0])
    stack_rows = [events.StackTrace(host=h, boot_id="b", seq=i, ts_ns=now, stack_id=sid, pid=7, comm=comm,
                                    kernel=k, user=u)
                  for i, (h, sid, comm, (u, k)) in enumerate([("h1", hog_id, "hog", HOG), ("h2", hog_id, "hog", HOG),
                                                              ("h1", other_id, "evil", OTHER)])]
    clickhouse.insert_records(client, "stacks", stack_rows)
    waits = [("h1", hog_id, 20), ("h2", hog_id, 30), ("h1", other_id, 40), ("h1", 0, 100)]
    clickhouse.insert_records(client, "runq_events", [
        events.RunqEvent(host=h, boot_id="b", seq=i, ts_ns=now - i * MS, pid=1, tid=1, comm="victim", cpu=0,
                         wait_ns=ms * MS, suspect_pid=7, suspect_tid=7, suspect_comm="x", suspect_stack=sid,
                         victim_stack=other_id if i == 0 else 0)
        for i, (h, sid, ms) in enumerate(waits)])
    clickhouse.insert_records(client, "alerts", [events.Alert(
        host="h1", boot_id="b", seq=42, ts_ns=now, raised_ns=now, kind="runq_starvation", severity="warning",
        pid=1, tid=1, comm="victim", cpu=0, wait_ns=20 * MS, suspect_pid=7, suspect_comm="hog",
        cpus_allowed=[0], summary="", remedy="", suspect_stack=hog_id)])

    def run(sql, params):
        return [list(r) for r in client.query(sql, parameters={k: str(v) for k, v in params.items()}).result_rows]

    yield run
    client.close()


def test_culprits_ranked_by_wait_caused_across_hosts(query):
    now = time.time_ns()
    top = store.top(query, now - 3600 * 10**9, now + 10**9)
    assert [(s.comm, s.wait_ns // MS, s.waits, s.hosts) for s in top] == [("hog", 50, 2, 2), ("evil", 40, 1, 1)]
    assert top[0].frames() == ["hog", "main", "jitterscope_hog_spin", "schedule_[k]", "__schedule_[k]"]
    only_h2 = store.top(query, now - 3600 * 10**9, now + 10**9, host="h2")
    assert [(s.comm, s.wait_ns // MS) for s in only_h2] == [("hog", 30)]
    assert store.top(query, now - 3600 * 10**9, now + 10**9, role="victim")[0].comm == "evil"


def test_folded_output_and_one_alert(query):
    lines = []
    stacks_cmd.run(query, lines.append, since="1h", folded=True)
    assert lines[0] == "hog;main;jitterscope_hog_spin;schedule_[k];__schedule_[k] 50000"
    lines.clear()
    stacks_cmd.run(query, lines.append, alert=42, host="h1")
    assert "victim (pid 1) waited 20.0 ms" in lines[0]
    assert "    jitterscope_hog_spin" in lines and "victim stack (where it was preempted, as it became a waiter): " \
        "none captured" in lines
    assert any(line.startswith("suspect stack (where it gave up the CPU") for line in lines)  # which is which


def test_report_section_escapes_frames(query):
    html = store.section(type("Ctx", (), {"query": staticmethod(query), "since_s": 3600})())
    assert "jitterscope_hog_spin" in html and "&lt;script&gt;" in html and "<script>" not in html


def test_report_and_cli_list_frames_in_one_order(query):
    """Innermost first, kernel frames above the user frames that called
    them, in `jitterscope stacks` and in the report alike, and both say so."""
    lines = []
    stacks_cmd.run(query, lines.append, since="1h", limit=1)
    assert lines[0].startswith("each culprit's stack where it gave up the CPU")  # what the stacks are, first
    cli_order = [line.strip().removesuffix("[kernel]").strip() for line in lines[2:]]
    assert cli_order == ["__schedule", "schedule", "jitterscope_hog_spin", "main"]
    html = store.section(type("Ctx", (), {"query": staticmethod(query), "since_s": 3600})())
    cell = html.split("<td><code>")[1].split("</code>")[0]  # the first row's stack
    assert [f.removesuffix(" [kernel]") for f in cell.split("<br>")] == cli_order
    assert "innermost frame first" in html and cell.startswith("__schedule [kernel]")


def test_stack_ids_are_stable_nonzero_and_fit_the_records():
    ids = {stack_id(f"p{i}", ["k"], [f"f{i}"]) for i in range(2000)}
    assert len(ids) == 2000 and 0 not in ids and max(ids) <= 2**63 - 1
    assert stack_id("a", ["k"], ["u"]) == stack_id("a", ["k"], ["u"]) != stack_id("a", ["k", "u"], [])
