-- 003: GPU driver calls, migrations, page placement and device traffic.

ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS evidence Map(String, String);

CREATE TABLE IF NOT EXISTS jitterscope.gpu_ioctls (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pid UInt32,
    tid UInt32,
    comm LowCardinality(String),
    fd Int32,
    request UInt64,
    latency_ns UInt64 CODEC(T64, ZSTD(1)),
    device LowCardinality(String)
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.migrations (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pid UInt32,
    tid UInt32,
    comm LowCardinality(String),
    interval_ns UInt64,
    migrations UInt32,
    cross_node UInt32,
    last_cpu UInt16
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.page_placement (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pid UInt32,
    comm LowCardinality(String),
    node Int16,
    interval_ns UInt64,
    page_cache_pages UInt64,
    alloc_pages UInt64
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.device_io (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    device LowCardinality(String),
    kind LowCardinality(String),
    pci LowCardinality(String),
    interval_ns UInt64,
    ios UInt64,
    bytes UInt64,
    latency_max_ns UInt64,
    latency_sum_ns UInt64
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gpu_ioctl_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gpu_ioctl_max_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gpu_ioctls UInt32;
