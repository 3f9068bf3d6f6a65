# SPDX-License-Identifier: Apache-2.0
"""The Prometheus histograms built from the collectors' log2 histograms, and
the consumer lag arithmetic (pure logic; the scrape of a running worker is
tests/integration/test_metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from jitterscope.streams.signal_metrics import OTHER, Log2Histograms
from jitterscope.streams.web import partition_lag


def exposition(h: Log2Histograms) -> str:
    registry = CollectorRegistry()
    registry.register(h)
    return generate_latest(registry).decode()


def test_log2_slots_land_in_their_own_bucket_exactly():
    h = Log2Histograms("t_seconds", "test", max_comms=5)
    h.add("vllm", [0, 3, 13], [4, 2, 1])  # <2 us, 8-16 us, 8.2-16.4 ms
    text = exposition(h)
    assert 't_seconds_bucket{comm="vllm",le="2e-06"} 4.0' in text
    assert 't_seconds_bucket{comm="vllm",le="8e-06"} 4.0' in text
    assert 't_seconds_bucket{comm="vllm",le="1.6e-05"} 6.0' in text
    assert 't_seconds_bucket{comm="vllm",le="0.008192"} 6.0' in text
    assert 't_seconds_bucket{comm="vllm",le="0.016384"} 7.0' in text
    assert 't_seconds_count{comm="vllm"} 7.0' in text


def test_slots_past_the_last_bucket_count_only_in_inf():
    h = Log2Histograms("t_seconds", "test")
    h.add("x", [40], [2])
    text = exposition(h)
    assert 't_seconds_bucket{comm="x",le="134.217728"} 0.0' in text
    assert 't_seconds_bucket{comm="x",le="+Inf"} 2.0' in text


def test_names_past_the_cap_go_to_other_and_stay_there():
    h = Log2Histograms("t_seconds", "test", max_comms=2)
    for comm in ("a", "b", "c", "d", "a", "c"):
        h.add(comm, [1], [1])
    text = exposition(h)
    assert 't_seconds_count{comm="a"} 2.0' in text and 't_seconds_count{comm="b"} 1.0' in text
    assert f't_seconds_count{{comm="{OTHER}"}} 3.0' in text and 'comm="c"' not in text


def test_lag_is_never_negative_and_unknown_when_nothing_was_fetched():
    assert partition_lag(120, 99, 50) == (100, 20)
    assert partition_lag(None, 99, 50) == (100, None)
    assert partition_lag(40, None, 50) == (50, 0)  # an under-reporting high-water mark
    assert partition_lag(40, None, None) == (None, None)
