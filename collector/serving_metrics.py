# SPDX-License-Identifier: Apache-2.0
"""The serving engine's own view, read from its Prometheus endpoint (vLLM's
``/metrics``): how many requests run and wait, how full its KV cache is, and
its own TTFT and inter-token latency histograms. Stored per interval beside
jitterscope's causes (the ``serving`` signal, collector/probes/serving.py),
so a report can set vLLM's P99 TTFT against what the kernel did that minute.

Pure: ``parse`` reads one scrape with prometheus_client's parser;
``interval`` turns two scrapes of one model into the interval's record
fields: the gauges as last read, each histogram's P50/P99 from the change of
its buckets (the requests that finished in the interval, as Prometheus'
``histogram_quantile`` over a rate would give them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

#: gauge field -> the names engines use for it (vLLM V1 first, then older releases)
GAUGES = {
    "requests_running": ("vllm:num_requests_running",),
    "requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
#: histogram prefix -> the names engines use for it
HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}
MODEL_LABEL = "model_name"


@dataclass
class Scrape:
    """One model's readings from one scrape: gauges, and each histogram's
    cumulative bucket counts (upper bound in seconds -> count)."""

    gauges: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


def parse(text: str) -> dict[str, Scrape]:
    """model name -> its readings ("" for series without a model label); the
    engine's other series are ignored. Raises ValueError for text that is
    not Prometheus' exposition format."""
    names = {name: ("gauge", key) for key, names in GAUGES.items() for name in names}
    names |= {name: ("histogram", key) for key, names in HISTOGRAMS.items() for name in names}
    out: dict[str, Scrape] = {}
    for family in text_string_to_metric_families(text):
        kind, key = names.get(family.name, (None, None))
        if kind is None:
            continue
        for sample in family.samples:
            scrape = out.setdefault(sample.labels.get(MODEL_LABEL, ""), Scrape())
            if kind == "gauge" and sample.name == family.name:
                scrape.gauges.setdefault(key, sample.value)  # the first engine's: one per model here
            elif kind == "histogram" and sample.name == family.name + "_bucket":
                bound = float(sample.labels["le"])
                counts = scrape.buckets.setdefault(key, {})
                counts[bound] = counts.get(bound, 0.0) + sample.value  # engines of one model add up
    return out


def since(before: dict[float, float], now: dict[float, float], bounds: list[float]) -> list[float]:
    """Each bucket's (``bounds``) count observed between two readings of a
    histogram's cumulative buckets; a counter that went down (a restart)
    counts from 0."""
    reset = any(now[b] < before.get(b, 0.0) for b in bounds)
    return [now[b] - (0.0 if reset else before.get(b, 0.0)) for b in bounds]


def quantile(q: float, before: dict[float, float], now: dict[float, float]) -> float:
    """The q-quantile (seconds) of what was observed between two readings of
    a histogram's cumulative buckets, interpolated within its bucket as
    Prometheus does; 0 where nothing was observed, the largest finite bound
    where it fell in +Inf."""
    bounds = sorted(now)
    counts = since(before, now, bounds)
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def interval(before: Scrape | None, now: Scrape) -> dict:
    """ServingMetrics fields for the interval between two scrapes of one
    model (no earlier scrape: the histograms since the engine started)."""
    fields = {key: float(now.gauges.get(key, 0.0)) for key in GAUGES}
    for key in HISTOGRAMS:
        counts, earlier = now.buckets.get(key, {}), (before.buckets.get(key, {}) if before else {})
        fields[f"{key}_count"] = round(since(earlier, counts, [math.inf])[0]) if math.inf in counts else 0
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            fields[f"{key}_{name}_ns"] = round(quantile(q, earlier, counts) * 1e9) if counts else 0
    return fields
