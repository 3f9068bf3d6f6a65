# SPDX-License-Identifier: Apache-2.0
"""Alert delay as `jitterscope up` reports it at stop (cli/up.py):
quantiles from the worker's histogram buckets on /metrics, the way
Prometheus' histogram_quantile() estimates them."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from jitterscope.up import alert_delay_line, histogram_quantile, parse_histograms

INF = float("inf")
FAMILY = "jitterscope_streams_alert_delay_seconds"


def test_quantile_interpolates_within_the_bucket_that_holds_the_rank():
    buckets = [(0.1, 50.0), (0.2, 90.0), (1.0, 100.0), (INF, 100.0)]
    assert histogram_quantile(0.5, buckets) == 0.1  # the rank is the first bucket's top
    assert math.isclose(histogram_quantile(0.25, buckets), 0.05)  # the first bucket starts at 0
    assert math.isclose(histogram_quantile(0.7, buckets), 0.15)  # 20 of the 40 in (0.1, 0.2]
    assert math.isclose(histogram_quantile(0.99, buckets), 0.2 + 0.8 * 9 / 10)


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound_and_empty_is_none():
    assert histogram_quantile(0.99, [(0.1, 1.0), (10.0, 2.0), (INF, 100.0)]) == 10.0
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None


def test_the_workers_exposition_is_read_per_kind_and_summarized():
    registry = CollectorRegistry()
    delay = Histogram(FAMILY, "x", ["kind"], buckets=(0.005, 0.05, 0.1, 0.2, 1.0, 10.0), registry=registry)
    for _ in range(90):
        delay.labels("runq_starvation").observe(0.03)
    for _ in range(10):
        delay.labels("runq_starvation").observe(0.5)
    delay.labels("cfs_throttling").observe(0.15)
    text = generate_latest(registry).decode()

    by_kind = parse_histograms(text, FAMILY, "kind")
    assert set(by_kind) == {"runq_starvation", "cfs_throttling"}
    runq = by_kind["runq_starvation"]
    assert runq[-1] == (INF, 100.0) and [b for b, _ in runq] == sorted(b for b, _ in runq)
    assert 0.005 < histogram_quantile(0.5, runq) <= 0.05 and 0.2 < histogram_quantile(0.99, runq) <= 1.0

    line = alert_delay_line(text)
    assert line.startswith("alert delay (event to alert raised): runq_starvation p50 ")  # the commonest first
    assert "(100 raised)" in line and "cfs_throttling p50 " in line and "\n" not in line


def test_no_alerts_or_no_histogram_says_nothing():
    registry = CollectorRegistry()
    Histogram(FAMILY, "x", ["kind"], registry=registry)  # no kind observed yet: no samples
    assert alert_delay_line(generate_latest(registry).decode()) is None
    assert alert_delay_line("# TYPE other_total counter\nother_total 3\n") is None
    assert alert_delay_line("not { prometheus") is None


def test_two_stages_expositions_of_one_kind_are_summed_not_interleaved():
    """`up` reads the judge's and the store's /metrics as one text: one
    kind in both (each raised some) is one histogram, its buckets summed."""
    texts = []
    for observed in ((0.03,) * 99, (5.0,)):  # the judge's 99 quick alerts, the store's one slow
        registry = CollectorRegistry()
        delay = Histogram(FAMILY, "x", ["kind"], buckets=(0.005, 0.05, 0.1, 1.0, 10.0), registry=registry)
        for seconds in observed:
            delay.labels("request_slo").observe(seconds)
        texts.append(generate_latest(registry).decode())

    [(kind, buckets)] = parse_histograms("\n".join(texts), FAMILY, "kind").items()
    assert kind == "request_slo" and buckets[-1] == (INF, 100.0)
    assert [b for b, _ in buckets] == [0.005, 0.05, 0.1, 1.0, 10.0, INF]  # each bound once
    assert 0.005 < histogram_quantile(0.5, buckets) <= 0.05 and histogram_quantile(0.99, buckets) <= 0.05
