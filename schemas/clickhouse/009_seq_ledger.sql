-- 009: the loss ledger's sequence numbers, pre-aggregated. `jitterscope
-- ledger` finds holes in each stored table's seq (reports/ledger.py); it
-- sorted every stored seq of every host to do so (10.7 s at 100M run-queue
-- events). Here each table's seqs are kept as roaring bitmaps per (host,
-- boot, table, block of 2^20 seqs): a block whose cardinality equals its
-- max - min + 1 has no hole, holes between blocks show in their min/max, and
-- only a block with a hole is opened (bitmapToArray). A bitmap is a set, so a
-- redelivered record adds nothing (stored = distinct seqs, as FINAL counted),
-- and the backfill below may overlap what the views already wrote.
--
-- A record is counted by its seq, not by the table's sort key: `stacks` keeps
-- one row per distinct stack (host, stack_id), but each record sent has its
-- own seq, so sent and stored now agree for it too.

CREATE TABLE IF NOT EXISTS jitterscope.seq_blocks (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    tbl LowCardinality(String),
    block UInt64,
    seqs AggregateFunction(groupBitmap, UInt64),
    last_ts SimpleAggregateFunction(max, DateTime64(9))
) ENGINE = AggregatingMergeTree
ORDER BY (host, boot_id, tbl, block);

-- one view per input table, then the rows already stored (a one-off backfill;
-- a cluster created from deploy/clickhouse-cluster/schema.sql has none)
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_runq_events_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'runq_events' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.runq_events GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'runq_events' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.runq_events GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_latency_histograms_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'latency_histograms' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.latency_histograms GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'latency_histograms' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.latency_histograms GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_topology_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'topology' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.topology GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'topology' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.topology GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_processes_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'processes' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.processes GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'processes' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.processes GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_collector_stats_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'collector_stats' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.collector_stats GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'collector_stats' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.collector_stats GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_requests_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'requests' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.requests GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'requests' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.requests GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_gpu_ioctls_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'gpu_ioctls' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.gpu_ioctls GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'gpu_ioctls' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.gpu_ioctls GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_migrations_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'migrations' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.migrations GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'migrations' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.migrations GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_page_placement_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'page_placement' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.page_placement GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'page_placement' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.page_placement GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_device_io_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'device_io' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.device_io GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'device_io' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.device_io GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_irq_time_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'irq_time' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.irq_time GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'irq_time' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.irq_time GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_cgroup_throttle_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'cgroup_throttle' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.cgroup_throttle GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'cgroup_throttle' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.cgroup_throttle GROUP BY host, boot_id, block;
CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_stacks_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'stacks' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.stacks GROUP BY host, boot_id, block;
INSERT INTO jitterscope.seq_blocks
    SELECT host, boot_id, 'stacks' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.stacks GROUP BY host, boot_id, block;
