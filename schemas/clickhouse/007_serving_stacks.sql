-- 007: real serving stacks. Processes carry their serving group and
-- container/Kubernetes identity; alerts and attributions name the pod; two
-- more causes (CFS throttling, interrupts) and the stacks behind an alert.

ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS ppid UInt32;
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS ns_pid UInt32;
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS serving_group UInt32;
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS container_id String DEFAULT '';
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS pod_uid LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS victim_stack UInt64;
ALTER TABLE jitterscope.alerts ADD COLUMN IF NOT EXISTS suspect_stack UInt64;

ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS throttled_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS irq_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS pids Array(UInt32);
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS pod LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '';

ALTER TABLE jitterscope.runq_events ADD COLUMN IF NOT EXISTS victim_stack UInt64 CODEC(T64, ZSTD(1));
ALTER TABLE jitterscope.runq_events ADD COLUMN IF NOT EXISTS suspect_stack UInt64 CODEC(T64, ZSTD(1));

CREATE TABLE IF NOT EXISTS jitterscope.irq_time (
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
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE TABLE IF NOT EXISTS jitterscope.cgroup_throttle (
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
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

-- One row per distinct stack per host: the key is the stack id, so the
-- collector re-sending a stack (after a restart) replaces, not adds.
CREATE TABLE IF NOT EXISTS jitterscope.stacks (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9),
    stack_id UInt64,
    pid UInt32,
    comm LowCardinality(String),
    kernel Array(String) CODEC(ZSTD(3)),
    user Array(String) CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(ts)
ORDER BY (host, stack_id);
