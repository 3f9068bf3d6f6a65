# SPDX-License-Identifier: Apache-2.0
"""The report's "Cost of watching" names jitterscope as a culprit from real
records in real ClickHouse (chDB, the migrations applied): the collector's
longest run on a CPU (CollectorStats.longest_run_ns) and the waits whose
suspect was one of its own processes (issue 39, part 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

REPORT = """
import tempfile, time
from pathlib import Path
from jitterscope.reports import capacity
from jitterscope.schemas import events
from jitterscope.streams import clickhouse
client = clickhouse.connect(None, Path(tempfile.mkdtemp()))
clickhouse.migrate(client)
now, h = time.time_ns(), {"host": "gpu-1", "boot_id": "b"}
clickhouse.insert_records(client, "collector_stats", [
    events.CollectorStats(**h, seq=i, ts_ns=now - i * 10**10, started_ns=now - 10**11, ringbuf_drops=0,
                          events_read=0, records_sent=0, delivery_errors=0, online_cpus=2, overhead_share=0.004,
                          longest_run_ns=run) for i, run in enumerate((800_000, 3_400_000))])

def wait(seq, wait_ns, suspect, own, waits=1):
    return events.RunqEvent(**h, seq=seq, ts_ns=now - seq * 1000, pid=40, tid=40, comm="vllm", cpu=0,
                            wait_ns=wait_ns, suspect_pid=7, suspect_tid=7, suspect_comm=suspect,
                            suspect_own=own, waits=waits)

clickhouse.insert_records(client, "runq_events", [
    wait(1, 4_200_000, "jitterscope:collector", True), wait(2, 9_000_000, "jitterscope:collector", True, 5),
    wait(3, 20_000_000, "logrotate", False), wait(4, 2_000_000, "jitterscope:worker", True)])
query = lambda sql, p: client.query(sql, parameters=p).result_rows
print(capacity.cost_of_watching(capacity.Context(query, 86400, None)))
print("=== summary, target 0.5% ===")
print(capacity.summary(capacity.Context(query, 86400, None)))
print("=== summary, target 0.3% ===")
print(capacity.summary(capacity.Context(query, 86400, None, self_cost_target=0.003)))
"""


def test_the_cost_of_watching_shows_the_collectors_longest_run_and_the_waits_behind_jitterscope():
    result = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    html = result.stdout
    # host, longest run 3.4 ms (the worse interval), 7 of 8 waits behind its own (a summed row counts its waits),
    # the longest single one 4.2 ms (a sum of short waits is none), most often the collector
    assert ("<tr><td>gpu-1</td><td>3.40</td><td>7</td><td>87.50%</td><td>4.20</td>"
            "<td>jitterscope:collector</td></tr>") in html, html[-3000:]
    # over the target, the summary says so first (not only the section near the bottom)
    _, under, over = html.split("=== summary")
    assert "cost-warning" not in under
    assert ('Watching cost 1 host(s) more than the 0.30% target, the worst gpu-1 at 0.40% of its CPU'
            in over.split("<h3>")[0]), over[:2000]
