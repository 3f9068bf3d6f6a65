# SPDX-License-Identifier: Apache-2.0
"""What `jitterscope up` reads on its streams stages' /metrics (pure: text
in, numbers out): per-topic counts for the drain on stop, and the alert
delay it prints as it stops (cli/up.py)."""

from __future__ import annotations

#: the worker's counter of records stored or dead-lettered, per input topic
#: (the family name: its samples are named ..._total)
ACCOUNTED = "jitterscope_streams_records_accounted"
#: the worker's counter of records decoded, per input topic
DECODED = "jitterscope_streams_records"
#: the worker's histogram of alert raised minus event time, per alert kind
ALERT_DELAY = "jitterscope_streams_alert_delay_seconds"


def parse_accounted(metrics_text: str) -> dict[str, int] | None:
    """topic -> records stored or dead-lettered, from the worker's /metrics
    text; None when the worker does not export the counter at all."""
    return parse_per_topic(metrics_text, ACCOUNTED)


def parse_per_topic(metrics_text: str, counter: str) -> dict[str, int] | None:
    """topic -> the worker's ``counter`` (a family name), from its /metrics
    text; None when the worker does not export the counter at all."""
    from prometheus_client.parser import text_string_to_metric_families

    found = None
    for family in text_string_to_metric_families(metrics_text):
        if family.name == counter:
            found = found or {}
            for sample in family.samples:
                if sample.name == counter + "_total":
                    found[sample.labels.get("topic", "")] = int(sample.value)
    return found


def parse_histograms(metrics_text: str, family: str, label: str) -> dict[str, list[tuple[float, float]]]:
    """A Prometheus histogram family from /metrics text, per value of
    ``label``: its cumulative buckets as (upper bound, count), ascending,
    +Inf last. The text may be several processes' (`up`'s judge and store):
    the same bucket of the same series is summed, as Prometheus' sum() by
    (le) would, never listed twice."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {}
    for found in text_string_to_metric_families(metrics_text):
        if found.name == family:
            for sample in found.samples:
                if sample.name == family + "_bucket":
                    buckets = out.setdefault(sample.labels.get(label, ""), {})
                    upper = float(sample.labels["le"])
                    buckets[upper] = buckets.get(upper, 0.0) + sample.value
    return {key: sorted(buckets.items()) for key, buckets in out.items()}


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative buckets (upper bound, count), as
    Prometheus' histogram_quantile() estimates it: linear within the bucket
    that holds the rank (the first one from 0); in the +Inf bucket, the
    largest finite bound. None for an empty histogram."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = upper, count
    return lower


def alert_delay_line(metrics_text: str) -> str | None:
    """p50/p99 of the worker's alert delay (raised minus the event's time),
    per alert kind, the commonest first; None when it raised none."""
    parts = []
    try:
        by_kind = parse_histograms(metrics_text, ALERT_DELAY, "kind")
    except ValueError:  # not Prometheus text: nothing to say
        return None
    for kind, buckets in sorted(by_kind.items(), key=lambda kv: (-kv[1][-1][1], kv[0])):
        p50, p99 = histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
        if p50 is not None:
            parts.append(f"{kind} p50 {p50 * 1e3:,.0f} ms, p99 {p99 * 1e3:,.0f} ms ({int(buckets[-1][1]):,} raised)")
    return "alert delay (event to alert raised): " + "; ".join(parts) if parts else None
