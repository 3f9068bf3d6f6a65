-- 001: the walking skeleton's tables. Every record table is a
-- ReplacingMergeTree whose key ends in (boot_id, seq): Kafka delivers at
-- least once, and a redelivered record (same host, ts, boot_id, seq)
-- collapses into the one already stored (query with FINAL where exact counts
-- matter). Time-series tables sort by (host, ts, ...) for the common
-- question "this host, this period", partitioned by day so retention drops
-- whole parts. Times are epoch ns in DateTime64(9).

CREATE TABLE IF NOT EXISTS jitterscope.runq_events (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pid UInt32,
    tid UInt32,
    comm LowCardinality(String),
    cpu UInt16,
    wait_ns UInt64 CODEC(T64, ZSTD(1)),
    suspect_pid UInt32,
    suspect_tid UInt32,
    suspect_comm LowCardinality(String)
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.latency_histograms (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    probe LowCardinality(String),
    interval_ns UInt64,
    pid UInt32,
    comm LowCardinality(String),
    slots Array(UInt8),
    counts Array(UInt64)
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.topology (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    cpus Array(UInt16),
    numa_nodes Array(Tuple(node UInt16, cpus Array(UInt16), memory_bytes UInt64, pfn_ranges Array(Array(UInt64)))),
    cpu_info Array(Tuple(cpu UInt16, node Int16, socket Int16, core Int32, siblings Array(UInt16))),
    pci Array(Tuple(address String, kind String, vendor UInt32, device UInt32, class_code UInt32,
                    numa_node Int16, upstream Array(String), name String, link_gen UInt8, link_width UInt8))
) ENGINE = ReplacingMergeTree
ORDER BY (host, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.processes (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    pid UInt32,
    comm LowCardinality(String),
    cmdline String CODEC(ZSTD(3)),
    cgroup String CODEC(ZSTD(3)),
    cpus_allowed Array(UInt16),
    gpus Array(String),
    cuda_visible_devices String
) ENGINE = ReplacingMergeTree
ORDER BY (host, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.collector_stats (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    started_ns UInt64,
    ringbuf_drops UInt64,
    events_read UInt64,
    records_sent UInt64,
    delivery_errors UInt64
) ENGINE = ReplacingMergeTree
ORDER BY (host, boot_id, seq);

-- An alert's (boot_id, seq) are those of its evidence record, so re-processing
-- the same evidence replaces the alert instead of adding one.
CREATE TABLE IF NOT EXISTS jitterscope.alerts (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    raised DateTime64(9),
    kind LowCardinality(String),
    severity LowCardinality(String),
    pid UInt32,
    tid UInt32,
    comm LowCardinality(String),
    cpu UInt16,
    wait_ns UInt64,
    suspect_pid UInt32,
    suspect_comm LowCardinality(String),
    cpus_allowed Array(UInt16),
    summary String,
    remedy String
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, kind, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.deadletter (
    ts DateTime64(9),
    topic LowCardinality(String),
    partition UInt32,
    offset UInt64,
    line UInt32,
    reason String,
    payload String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree
ORDER BY (topic, partition, offset, line);
