CREATE DATABASE IF NOT EXISTS jitterscope ON CLUSTER '{cluster}';

CREATE TABLE IF NOT EXISTS jitterscope.runq_events_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/runq_events', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.runq_events ON CLUSTER '{cluster}' AS jitterscope.runq_events_local ENGINE = Distributed('{cluster}', 'jitterscope', 'runq_events_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.latency_histograms_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/latency_histograms', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.latency_histograms ON CLUSTER '{cluster}' AS jitterscope.latency_histograms_local ENGINE = Distributed('{cluster}', 'jitterscope', 'latency_histograms_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.topology_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    cpus Array(UInt16),
    numa_nodes Array(Tuple(node UInt16, cpus Array(UInt16), memory_bytes UInt64, pfn_ranges Array(Array(UInt64)))),
    cpu_info Array(Tuple(cpu UInt16, node Int16, socket Int16, core Int32, siblings Array(UInt16))),
    pci Array(Tuple(address String, kind String, vendor UInt32, device UInt32, class_code UInt32,
                    numa_node Int16, upstream Array(String), name String, link_gen UInt8, link_width UInt8))
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/topology', '{replica}')
ORDER BY (host, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.topology ON CLUSTER '{cluster}' AS jitterscope.topology_local ENGINE = Distributed('{cluster}', 'jitterscope', 'topology_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.processes_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/processes', '{replica}')
ORDER BY (host, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.processes ON CLUSTER '{cluster}' AS jitterscope.processes_local ENGINE = Distributed('{cluster}', 'jitterscope', 'processes_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.collector_stats_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    started_ns UInt64,
    ringbuf_drops UInt64,
    events_read UInt64,
    records_sent UInt64,
    delivery_errors UInt64
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/collector_stats', '{replica}')
ORDER BY (host, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.collector_stats ON CLUSTER '{cluster}' AS jitterscope.collector_stats_local ENGINE = Distributed('{cluster}', 'jitterscope', 'collector_stats_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.alerts_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/alerts', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, kind, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.alerts ON CLUSTER '{cluster}' AS jitterscope.alerts_local ENGINE = Distributed('{cluster}', 'jitterscope', 'alerts_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.deadletter_local ON CLUSTER '{cluster}' (
    ts DateTime64(9),
    topic LowCardinality(String),
    partition UInt32,
    offset UInt64,
    line UInt32,
    reason String,
    payload String CODEC(ZSTD(3))
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/deadletter', '{replica}')
ORDER BY (topic, partition, offset, line);

CREATE TABLE IF NOT EXISTS jitterscope.deadletter ON CLUSTER '{cluster}' AS jitterscope.deadletter_local ENGINE = Distributed('{cluster}', 'jitterscope', 'deadletter_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.requests_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/requests', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.requests ON CLUSTER '{cluster}' AS jitterscope.requests_local ENGINE = Distributed('{cluster}', 'jitterscope', 'requests_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.request_attribution_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/request_attribution', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.request_attribution ON CLUSTER '{cluster}' AS jitterscope.request_attribution_local ENGINE = Distributed('{cluster}', 'jitterscope', 'request_attribution_local', cityHash64(host));

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS request_id String DEFAULT '';

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS request_id String DEFAULT '';

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS evidence Map(String, String);

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS evidence Map(String, String);

CREATE TABLE IF NOT EXISTS jitterscope.gpu_ioctls_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/gpu_ioctls', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.gpu_ioctls ON CLUSTER '{cluster}' AS jitterscope.gpu_ioctls_local ENGINE = Distributed('{cluster}', 'jitterscope', 'gpu_ioctls_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.migrations_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/migrations', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.migrations ON CLUSTER '{cluster}' AS jitterscope.migrations_local ENGINE = Distributed('{cluster}', 'jitterscope', 'migrations_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.page_placement_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/page_placement', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.page_placement ON CLUSTER '{cluster}' AS jitterscope.page_placement_local ENGINE = Distributed('{cluster}', 'jitterscope', 'page_placement_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.device_io_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/device_io', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.device_io ON CLUSTER '{cluster}' AS jitterscope.device_io_local ENGINE = Distributed('{cluster}', 'jitterscope', 'device_io_local', cityHash64(host));

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctl_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctl_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctl_max_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctl_max_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctls UInt32;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctls UInt32;

CREATE TABLE IF NOT EXISTS jitterscope.latency_minute_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    probe LowCardinality(String),
    minute DateTime CODEC(Delta, ZSTD(1)),
    quantiles AggregateFunction(quantilesTDigestWeighted(0.5, 0.99, 0.999), Float64, UInt64),
    observations SimpleAggregateFunction(sum, UInt64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/jitterscope/latency_minute', '{replica}')
PARTITION BY toDate(minute)
ORDER BY (probe, host, minute);

CREATE TABLE IF NOT EXISTS jitterscope.latency_minute ON CLUSTER '{cluster}' AS jitterscope.latency_minute_local ENGINE = Distributed('{cluster}', 'jitterscope', 'latency_minute_local', cityHash64(host));

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.latency_minute_mv ON CLUSTER '{cluster}' TO jitterscope.latency_minute_local AS
SELECT host, probe, toStartOfMinute(ts) AS minute,
       quantilesTDigestWeightedState(0.5, 0.99, 0.999)(pow(2, slot) * 1.5, count) AS quantiles,
       sum(count) AS observations
FROM jitterscope.latency_histograms_local
ARRAY JOIN slots AS slot, counts AS count
GROUP BY host, probe, minute;

CREATE TABLE IF NOT EXISTS jitterscope.attribution_minute_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    cause LowCardinality(String),
    minute DateTime CODEC(Delta, ZSTD(1)),
    requests SimpleAggregateFunction(sum, UInt64),
    over_slo SimpleAggregateFunction(sum, UInt64),
    excess_ns SimpleAggregateFunction(sum, UInt64),
    duration_quantiles AggregateFunction(quantiles(0.5, 0.99, 0.999), UInt64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/jitterscope/attribution_minute', '{replica}')
PARTITION BY toDate(minute)
ORDER BY (cause, host, minute);

CREATE TABLE IF NOT EXISTS jitterscope.attribution_minute ON CLUSTER '{cluster}' AS jitterscope.attribution_minute_local ENGINE = Distributed('{cluster}', 'jitterscope', 'attribution_minute_local', cityHash64(host));

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.attribution_minute_mv ON CLUSTER '{cluster}' TO jitterscope.attribution_minute_local AS
SELECT host, cause, toStartOfMinute(ts) AS minute, count() AS requests,
       countIf(slo_breached) AS over_slo, sum(excess_ns) AS excess_ns,
       quantilesState(0.5, 0.99, 0.999)(duration_ns) AS duration_quantiles
FROM jitterscope.request_attribution_local
GROUP BY host, cause, minute;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS map_full_drops UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS map_full_drops UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS spool_drops UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS spool_drops UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS spooled UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS spooled UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS producer_restarts UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS producer_restarts UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS sent_by_topic Map(String, UInt64);

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS sent_by_topic Map(String, UInt64);

ALTER TABLE jitterscope.deadletter_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS host LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.deadletter ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS host LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS cpu_ns UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS cpu_ns UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS rss_bytes UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS rss_bytes UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_ns UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_ns UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_count UInt64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_count UInt64;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_ns_by_program Map(String, UInt64);

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_ns_by_program Map(String, UInt64);

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_count_by_program Map(String, UInt64);

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS bpf_run_count_by_program Map(String, UInt64);

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS online_cpus UInt16;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS online_cpus UInt16;

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS overhead_share Float64;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS overhead_share Float64;

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS ppid UInt32;

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS ppid UInt32;

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS ns_pid UInt32;

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS ns_pid UInt32;

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS serving_group UInt32;

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS serving_group UInt32;

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container_id String DEFAULT '';

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container_id String DEFAULT '';

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod_uid LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod_uid LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS victim_stack UInt64;

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS victim_stack UInt64;

ALTER TABLE jitterscope.alerts_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS suspect_stack UInt64;

ALTER TABLE jitterscope.alerts ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS suspect_stack UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS throttled_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS throttled_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS irq_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS irq_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pids Array(UInt32);

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pids Array(UInt32);

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.runq_events_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS victim_stack UInt64 CODEC(T64, ZSTD(1));

ALTER TABLE jitterscope.runq_events ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS victim_stack UInt64 CODEC(T64, ZSTD(1));

ALTER TABLE jitterscope.runq_events_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS suspect_stack UInt64 CODEC(T64, ZSTD(1));

ALTER TABLE jitterscope.runq_events ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS suspect_stack UInt64 CODEC(T64, ZSTD(1));

CREATE TABLE IF NOT EXISTS jitterscope.irq_time_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    cpu UInt16,
    interval_ns UInt64,
    kind LowCardinality(String),
    source LowCardinality(String),
    count UInt64 CODEC(T64, ZSTD(1)),
    time_ns UInt64 CODEC(T64, ZSTD(1))
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/irq_time', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.irq_time ON CLUSTER '{cluster}' AS jitterscope.irq_time_local ENGINE = Distributed('{cluster}', 'jitterscope', 'irq_time_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.cgroup_throttle_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    cgroup String CODEC(ZSTD(3)),
    interval_ns UInt64,
    quota_us Int64,
    period_us UInt64,
    nr_periods UInt64,
    nr_throttled UInt64,
    throttled_ns UInt64
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/cgroup_throttle', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.cgroup_throttle ON CLUSTER '{cluster}' AS jitterscope.cgroup_throttle_local ENGINE = Distributed('{cluster}', 'jitterscope', 'cgroup_throttle_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.stacks_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    stack_id UInt64,
    pid UInt32,
    comm LowCardinality(String),
    kernel Array(String) CODEC(ZSTD(3)),
    user Array(String) CODEC(ZSTD(3))
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/stacks', '{replica}')(ts)
ORDER BY (host, stack_id);

CREATE TABLE IF NOT EXISTS jitterscope.stacks ON CLUSTER '{cluster}' AS jitterscope.stacks_local ENGINE = Distributed('{cluster}', 'jitterscope', 'stacks_local', cityHash64(host));

CREATE TABLE IF NOT EXISTS jitterscope.runq_minute_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    minute DateTime CODEC(Delta, ZSTD(1)),
    comm LowCardinality(String),
    suspect_comm LowCardinality(String),
    neighbour Bool,
    waits SimpleAggregateFunction(sum, UInt64),
    waited_ns SimpleAggregateFunction(sum, UInt64),
    max_wait_ns SimpleAggregateFunction(max, UInt64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/jitterscope/runq_minute', '{replica}')
PARTITION BY toDate(minute)
ORDER BY (minute, host, comm, suspect_comm, neighbour);

CREATE TABLE IF NOT EXISTS jitterscope.runq_minute ON CLUSTER '{cluster}' AS jitterscope.runq_minute_local ENGINE = Distributed('{cluster}', 'jitterscope', 'runq_minute_local', cityHash64(host));

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.runq_minute_mv ON CLUSTER '{cluster}' TO jitterscope.runq_minute_local AS
SELECT host, toStartOfMinute(ts) AS minute, comm, suspect_comm,
       suspect_pid != 0 AND suspect_pid != pid AS neighbour,
       count() AS waits, sum(wait_ns) AS waited_ns, max(wait_ns) AS max_wait_ns
FROM jitterscope.runq_events_local
GROUP BY host, minute, comm, suspect_comm, neighbour;

ALTER TABLE jitterscope.runq_events_local ON CLUSTER '{cluster}' MODIFY COLUMN host CODEC(ZSTD(1)), MODIFY COLUMN boot_id CODEC(ZSTD(1)),
    MODIFY COLUMN seq CODEC(Delta, ZSTD(1)), MODIFY COLUMN pid CODEC(T64, ZSTD(1)),
    MODIFY COLUMN tid CODEC(T64, ZSTD(1)), MODIFY COLUMN comm CODEC(ZSTD(1)),
    MODIFY COLUMN cpu CODEC(T64, ZSTD(1)), MODIFY COLUMN suspect_pid CODEC(T64, ZSTD(1)),
    MODIFY COLUMN suspect_tid CODEC(T64, ZSTD(1)), MODIFY COLUMN suspect_comm CODEC(ZSTD(1));

ALTER TABLE jitterscope.runq_events ON CLUSTER '{cluster}' MODIFY COLUMN host CODEC(ZSTD(1)), MODIFY COLUMN boot_id CODEC(ZSTD(1)),
    MODIFY COLUMN seq CODEC(Delta, ZSTD(1)), MODIFY COLUMN pid CODEC(T64, ZSTD(1)),
    MODIFY COLUMN tid CODEC(T64, ZSTD(1)), MODIFY COLUMN comm CODEC(ZSTD(1)),
    MODIFY COLUMN cpu CODEC(T64, ZSTD(1)), MODIFY COLUMN suspect_pid CODEC(T64, ZSTD(1)),
    MODIFY COLUMN suspect_tid CODEC(T64, ZSTD(1)), MODIFY COLUMN suspect_comm CODEC(ZSTD(1));

CREATE TABLE IF NOT EXISTS jitterscope.seq_blocks_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    tbl LowCardinality(String),
    block UInt64,
    seqs AggregateFunction(groupBitmap, UInt64),
    last_ts SimpleAggregateFunction(max, DateTime64(9))
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/jitterscope/seq_blocks', '{replica}')
ORDER BY (host, boot_id, tbl, block);

CREATE TABLE IF NOT EXISTS jitterscope.seq_blocks ON CLUSTER '{cluster}' AS jitterscope.seq_blocks_local ENGINE = Distributed('{cluster}', 'jitterscope', 'seq_blocks_local', cityHash64(host));

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_runq_events_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'runq_events' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.runq_events_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_latency_histograms_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'latency_histograms' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.latency_histograms_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_topology_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'topology' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.topology_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_processes_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'processes' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.processes_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_collector_stats_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'collector_stats' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.collector_stats_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_requests_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'requests' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.requests_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_gpu_ioctls_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'gpu_ioctls' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.gpu_ioctls_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_migrations_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'migrations' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.migrations_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_page_placement_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'page_placement' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.page_placement_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_device_io_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'device_io' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.device_io_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_irq_time_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'irq_time' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.irq_time_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_cgroup_throttle_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'cgroup_throttle' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.cgroup_throttle_local GROUP BY host, boot_id, block;

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_stacks_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'stacks' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.stacks_local GROUP BY host, boot_id, block;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS self_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS self_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS self_threads UInt32;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS self_threads UInt32;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS service_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS service_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctl_call LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_ioctl_call LowCardinality(String) DEFAULT '';

CREATE TABLE IF NOT EXISTS jitterscope.blocked_waits_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pid UInt32,
    tid UInt32,
    comm LowCardinality(String),
    kind LowCardinality(String),
    blocked_ns UInt64 CODEC(T64, ZSTD(1)),
    waker_pid UInt32,
    waker_tid UInt32,
    waker_comm LowCardinality(String)
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/blocked_waits', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.blocked_waits ON CLUSTER '{cluster}' AS jitterscope.blocked_waits_local ENGINE = Distributed('{cluster}', 'jitterscope', 'blocked_waits_local', cityHash64(host));

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_blocked_waits_mv ON CLUSTER '{cluster}' TO jitterscope.seq_blocks_local AS
    SELECT host, boot_id, 'blocked_waits' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.blocked_waits_local GROUP BY host, boot_id, block;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gil_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gil_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS memory_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS memory_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS io_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS io_wait_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS sleep_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS sleep_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS on_cpu_ns UInt64;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS on_cpu_ns UInt64;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS thread_tid UInt32;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS thread_tid UInt32;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS culprit String DEFAULT '';

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS culprit String DEFAULT '';

ALTER TABLE jitterscope.requests_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS tid UInt32;

ALTER TABLE jitterscope.requests ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS tid UInt32;

ALTER TABLE jitterscope.processes_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS memory_cgroup String DEFAULT '';

ALTER TABLE jitterscope.processes ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS memory_cgroup String DEFAULT '';

ALTER TABLE jitterscope.page_placement_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS memory_cgroup LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.page_placement ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS memory_cgroup LowCardinality(String) DEFAULT '';

CREATE TABLE IF NOT EXISTS jitterscope.gpu_xid_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    xid UInt16,
    pci LowCardinality(String),
    gpu LowCardinality(String),
    pid UInt32,
    comm LowCardinality(String),
    message String
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/gpu_xid', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.gpu_xid ON CLUSTER '{cluster}' AS jitterscope.gpu_xid_local ENGINE = Distributed('{cluster}', 'jitterscope', 'gpu_xid_local', cityHash64(host));

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_xid UInt16 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_xid UInt16 DEFAULT 0;

CREATE TABLE IF NOT EXISTS jitterscope.gpu_telemetry_local ON CLUSTER '{cluster}' (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pci LowCardinality(String),
    gpu LowCardinality(String),
    interval_ns UInt64,
    sm_clock_mhz UInt32,
    mem_clock_mhz UInt32,
    sm_clock_max_mhz UInt32,
    throttle_reasons UInt64,
    throttle Array(LowCardinality(String)),
    temperature_c UInt16,
    power_mw UInt32,
    pcie_tx_kbps UInt32,
    pcie_rx_kbps UInt32,
    nvlink_errors UInt64
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/gpu_telemetry', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.gpu_telemetry ON CLUSTER '{cluster}' AS jitterscope.gpu_telemetry_local ENGINE = Distributed('{cluster}', 'jitterscope', 'gpu_telemetry_local', cityHash64(host));

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_throttle Array(LowCardinality(String)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS gpu_throttle Array(LowCardinality(String)) DEFAULT [];

ALTER TABLE jitterscope.runq_events_local ON CLUSTER '{cluster}' MODIFY COLUMN ts CODEC(GCD, Delta, T64, ZSTD(1)),
    MODIFY COLUMN wait_ns CODEC(GCD, T64, ZSTD(1));

ALTER TABLE jitterscope.runq_events ON CLUSTER '{cluster}' MODIFY COLUMN ts CODEC(GCD, Delta, T64, ZSTD(1)),
    MODIFY COLUMN wait_ns CODEC(GCD, T64, ZSTD(1));

ALTER TABLE jitterscope.blocked_waits_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS device LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.blocked_waits ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS device LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.runq_events_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS waits UInt32 DEFAULT 1;

ALTER TABLE jitterscope.runq_events ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS waits UInt32 DEFAULT 1;

ALTER TABLE jitterscope.runq_events_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS suspect_own Bool DEFAULT startsWith(suspect_comm, 'jitterscope:');

ALTER TABLE jitterscope.runq_events ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS suspect_own Bool DEFAULT startsWith(suspect_comm, 'jitterscope:');

ALTER TABLE jitterscope.collector_stats_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS longest_run_ns UInt64 DEFAULT 0;

ALTER TABLE jitterscope.collector_stats ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS longest_run_ns UInt64 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    causes Array(Tuple(cause LowCardinality(String), share Float32)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    causes Array(Tuple(cause LowCardinality(String), share Float32)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    chain Array(Tuple(tid UInt32, comm String, waited_ns UInt64, kind LowCardinality(String), ns UInt64,
                      culprit String)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    chain Array(Tuple(tid UInt32, comm String, waited_ns UInt64, kind LowCardinality(String), ns UInt64,
                      culprit String)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS span_id String DEFAULT '' AFTER trace_id;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS span_id String DEFAULT '' AFTER trace_id;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    phases Array(Tuple(phase LowCardinality(String), ns UInt64, cause LowCardinality(String), cause_ns UInt64,
                       culprit String, runq_ns UInt64, gil_ns UInt64, memory_ns UInt64, io_ns UInt64)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    phases Array(Tuple(phase LowCardinality(String), ns UInt64, cause LowCardinality(String), cause_ns UInt64,
                       culprit String, runq_ns UInt64, gil_ns UInt64, memory_ns UInt64, io_ns UInt64)) DEFAULT [];

ALTER TABLE jitterscope.requests_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS model LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.requests ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS model LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.requests_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS output_tokens UInt32 DEFAULT 0;

ALTER TABLE jitterscope.requests ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS output_tokens UInt32 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS model LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS model LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS ttft_ns UInt64 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS ttft_ns UInt64 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS itl_ns UInt64 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS itl_ns UInt64 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    token_slo_breached Array(LowCardinality(String)) DEFAULT [];

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS
    token_slo_breached Array(LowCardinality(String)) DEFAULT [];

CREATE TABLE IF NOT EXISTS jitterscope.serving_metrics_local ON CLUSTER '{cluster}' (
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
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/jitterscope/serving_metrics', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.serving_metrics ON CLUSTER '{cluster}' AS jitterscope.serving_metrics_local ENGINE = Distributed('{cluster}', 'jitterscope', 'serving_metrics_local', cityHash64(host));

ALTER TABLE jitterscope.request_attribution_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS culprit_stack UInt64 DEFAULT 0;

ALTER TABLE jitterscope.request_attribution ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS culprit_stack UInt64 DEFAULT 0;

ALTER TABLE jitterscope.page_placement_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS exited Bool DEFAULT false;

ALTER TABLE jitterscope.page_placement ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS exited Bool DEFAULT false;
