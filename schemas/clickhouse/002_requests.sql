-- 002: inference requests (from OTLP spans) and their attribution.

CREATE TABLE IF NOT EXISTS jitterscope.requests (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    span_id String,
    name LowCardinality(String),
    pid UInt32,
    start_ns UInt64,
    end_ns UInt64,
    status LowCardinality(String),
    queue_ns UInt64,
    prefill_ns UInt64,
    decode_ns UInt64,
    ttft_ns UInt64,
    INDEX request_id_idx request_id TYPE bloom_filter(0.01) GRANULARITY 4
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

-- One row per request: keyed by its span's record key, so re-attribution
-- (a worker restart) replaces the row. Looked up by request_id through the
-- bloom-filter index.
CREATE TABLE IF NOT EXISTS jitterscope.request_attribution (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    request_id String,
    trace_id String,
    name LowCardinality(String),
    pid UInt32,
    start_ns UInt64,
    end_ns UInt64,
    duration_ns UInt64 CODEC(T64, ZSTD(1)),
    baseline_ns UInt64,
    excess_ns UInt64,
    status LowCardinality(String),
    runq_wait_ns UInt64,
    runq_wait_max_ns UInt64,
    runq_waits UInt32,
    suspects Array(Tuple(pid UInt32, comm String, wait_ns UInt64)),
    cause LowCardinality(String),
    explained Float32,
    slo_ns UInt64,
    slo_breached Bool,
    INDEX request_id_idx request_id TYPE bloom_filter(0.01) GRANULARITY 4
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS request_id String DEFAULT '';
