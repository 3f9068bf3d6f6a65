-- SPDX-License-Identifier: Apache-2.0
-- 022: the serving engine's own metrics (ServingMetrics, collector/serving_metrics.py), per
-- model and interval: vLLM's queue and KV-cache use, and its TTFT and inter-token latency
-- P50/P99 over the requests that finished in the interval, beside jitterscope's causes.
CREATE TABLE IF NOT EXISTS jitterscope.serving_metrics (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    endpoint LowCardinality(String),
    model LowCardinality(String),
    interval_ns UInt64,
    requests_running Float64,
    requests_waiting Float64,
    kv_cache_usage Float64,
    ttft_count UInt32,
    ttft_p50_ns UInt64,
    ttft_p99_ns UInt64,
    itl_count UInt32,
    itl_p50_ns UInt64,
    itl_p99_ns UInt64
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);
