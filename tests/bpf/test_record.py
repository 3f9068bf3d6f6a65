# SPDX-License-Identifier: Apache-2.0
"""`jitterscope record` on the real kernel: the collector writes its records
to a file (no Kafka), topology and stats included, readable afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jitterscope.collector.recording import RecordingReader, summarize
from jitterscope.schemas import batches, events, topics

pytestmark = pytest.mark.bpf


def test_record_writes_topology_and_stats(tmp_path):
    out = tmp_path / "host.jsrec.gz"
    env = {**os.environ, "JITTERSCOPE_DATA_DIR": str(tmp_path / "data"), "JITTERSCOPE_OTLP_PORT": "0",
           "JITTERSCOPE_HOST": f"record-{os.getpid()}"}
    env.pop("JITTERSCOPE_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "jitterscope.cli", "record", "--duration", "3", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    summary = summarize(out)
    assert not summary.truncated and summary.hosts == {f"record-{os.getpid()}"}
    assert summary.by_topic.get(topics.TOPOLOGY, 0) >= 1 and summary.by_topic.get(topics.COLLECTOR_STATS, 0) >= 1
    assert f"recorded {summary.records:,} records" in " ".join(done.stdout.split())

    frames = {f.topic: f for f in RecordingReader(out)}
    topology, _bad = batches.BatchDecoder(events.Topology).decode(frames[topics.TOPOLOGY].payload)
    assert topology[0].cpus == sorted(os.sched_getaffinity(0) | set(topology[0].cpus))  # every CPU of the host
    stats, _bad = batches.BatchDecoder(events.CollectorStats).decode(frames[topics.COLLECTOR_STATS].payload)
    # the last stats record counts what was written before it, as with Kafka
    assert stats[-1].delivery_errors == 0 and stats[-1].records_sent == sum(stats[-1].sent_by_topic.values())
