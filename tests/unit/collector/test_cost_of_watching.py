# SPDX-License-Identifier: Apache-2.0
"""The collector as a culprit (issue 39, part 1): its longest run on a CPU
goes out in CollectorStats and into its final file, with how often others
waited behind jitterscope's own processes; `doctor` says both."""

from __future__ import annotations

import json
import os

from jitterscope.collector import pacing
from jitterscope.collector.agent import Collector
from jitterscope.collector.probes import runq
from jitterscope.common.settings import Settings
from jitterscope.schemas import events


class Discard:
    records_sent = delivery_errors = spool_drops = spooled = producer_restarts = undelivered = 0
    sent_by_topic: dict = {}

    def send(self, topic, batch):
        pass


class Clock:
    now = 0

    def __call__(self) -> int:
        return self.now


def test_the_longest_run_reaches_the_stats_the_final_file_and_doctor(tmp_path, monkeypatch):
    from jitterscope.doctor import check_self_cost

    clock, yields = Clock(), []
    monkeypatch.setattr(pacing, "PACER", pacing.Pacer(clock=clock, yield_cpu=lambda: yields.append(clock.now)))
    monkeypatch.setattr(pacing, "point", pacing.PACER.point)
    collector = Collector(Settings(data_dir=tmp_path, spool_max_mb=0), publisher=Discard())
    pacing.PACER.waiting(lambda: None)  # the loop's poll returned at 0
    clock.now = 3_200_000  # 3.2 ms of work without a pace point
    collector.describe_process(os.getpid())  # a record queued: a pace point
    assert yields == [3_200_000]
    collector.publish_stats()
    [stats] = [r for _, batch in collector.batcher.drain() for r in batch if isinstance(r, events.CollectorStats)]
    assert stats.longest_run_ns == 3_200_000

    signal = runq.RunqSignal()  # its count of others' waits behind jitterscope's own
    signal.behind_own = {"waits": 4, "longest_wait_ns": 2_500_000}
    collector.probes = [signal]
    final = json.loads(collector.write_final().read_text())
    assert final["longest_run_ns"] == 3_200_000 and final["behind_own"]["waits"] == 4

    final["self_cost"] = {"overhead_share": 0.004, "bpf_share": 0.001, "collector_share": 0.003,
                          "rss_bytes": 90_000_000}
    (tmp_path / "collector-final.json").write_text(json.dumps(final))
    detail = check_self_cost(Settings(data_dir=tmp_path)).detail
    assert "the collector's longest run on a CPU 3.2 ms" in detail
    assert "waited behind jitterscope's own processes 4 times (longest 2.5 ms)" in detail


def test_doctor_says_nothing_of_runs_a_collector_before_them_did_not_measure(tmp_path):
    from jitterscope.doctor import check_self_cost

    (tmp_path / "collector-final.json").write_text(json.dumps({"self_cost": {
        "overhead_share": 0.004, "bpf_share": 0.001, "collector_share": 0.003, "rss_bytes": 90_000_000}}))
    detail = check_self_cost(Settings(data_dir=tmp_path)).detail
    assert "0.40% of CPU" in detail and "longest run" not in detail
