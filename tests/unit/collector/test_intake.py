# SPDX-License-Identifier: Apache-2.0
"""The collector's bounded intake (collector/intake.py; issue 40, items 4
and 5): spans per body, per sender and queued; heads per sender; targets
per host. The real-kernel, as-nobody version is tests/bpf/test_sender_limits.py."""

from __future__ import annotations

import gzip
import os

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from jitterscope.collector.intake import Intake
from jitterscope.collector.otlp.convert import OtlpError
from jitterscope.collector.otlp.server import OtlpReceiver
from jitterscope.common.settings import Settings
from tests.fixtures.otlp_builder import export, post, span


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def intake(clock=None, **kw) -> Intake:
    limits = dict(otlp_max_spans_per_request=100, otlp_sender_spans_per_s=10, otlp_sender_burst_spans=150,
                  otlp_queue_max_spans=200, serving_heads_per_sender=2, serving_targets_max=5)
    return Intake(Settings(host="h", **(limits | kw)), clock or Clock())


def test_spans_per_body_and_per_sender_are_bounded_and_counted():
    clock = Clock()
    i = intake(clock)
    assert i.admit("uid:65534", 70_000) == 100  # a bomb's body: its first 100
    assert i.admit("uid:65534", 100) == 50  # what is left of the burst
    with pytest.raises(OtlpError) as refused:
        i.admit("uid:65534", 10)
    assert refused.value.status_code == 429
    assert i.admit("uid:0", 10) == 10  # another sender has its own bucket
    clock.now = 2.0  # 10 spans/s refill
    assert i.admit("uid:65534", 100) == 20
    assert i.shed == {"request_cap": 69_900, "sender_rate": 50 + 10 + 80, "queue_full": 0}


def test_the_queue_is_bounded_and_a_full_one_answers_503():
    i = intake()
    i.put("a", [{}] * 150)
    with pytest.raises(OtlpError) as full:
        i.put("b", [{}] * 60)
    assert full.value.status_code == 503 and i.shed["queue_full"] == 60 and i.queued == 150
    assert [(s, len(r)) for s, r in i.take()] == [("a", 150)] and i.queued == 0
    i.put("b", [{}] * 60)  # room again once the loop took them


def test_heads_per_sender_and_targets_per_host():
    i = intake()
    assert [i.admit_head(pid, "uid:65534") for pid in (10, 11, 12, 13)] == [True, True, False, False]
    assert i.admit_head(12, "uid:65534") is False and i.heads_refused.total == 2  # each counted once
    assert i.admit_head(20, "uid:0")
    i.keep_heads({11, 20})  # 10 exited: its sender has room again
    assert i.admit_head(12, "uid:65534") and list(i.heads) == [11, 20, 12]
    groups = {12: 12, 121: 12, 122: 12, 11: 11, 111: 11, 20: 20, 201: 20, 5: 5}  # 5: admitted by other means
    kept = i.bound_targets(groups)
    assert kept == {5: 5, 11: 11, 111: 11, 20: 20, 201: 20}  # the earliest heads' first
    assert i.over_host.total == 3
    i.bound_targets(groups)
    assert i.over_host.total == 3  # still over: not counted again


def test_the_receiver_cuts_a_body_before_converting_it_and_says_so():
    i = intake(otlp_max_spans_per_request=3)
    with OtlpReceiver("127.0.0.1", 0, None, intake=i) as r:
        body = export(*[span(span_id=os.urandom(8)) for _ in range(50)], pid=1).SerializeToString()
        status, _, answer = post(r.port, gzip.compress(body), headers={"Content-Encoding": "gzip"})
    assert status == 200
    reply = ExportTraceServiceResponse.FromString(answer)
    assert reply.partial_success.rejected_spans == 47 and "limits" in reply.partial_success.error_message
    (sender, records), = i.take()
    assert len(records) <= 3 and sender.startswith("uid:") and i.shed["request_cap"] == 47
