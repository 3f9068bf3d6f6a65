-- 011: where a slow request's time went when its thread was blocked, not
-- runnable (bpf/blocked.bpf.c): waiting for the interpreter lock (GIL),
-- for memory (a page-cache fault, reclaim), for uninterruptible I/O, or any
-- other sleep. One row per blocked interval of a serving-group thread at or
-- above the probe's threshold; the waker is the task that woke it (for the
-- GIL: the thread that released the lock).

CREATE TABLE IF NOT EXISTS jitterscope.blocked_waits (
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
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.seq_blocks_blocked_waits_mv TO jitterscope.seq_blocks AS
    SELECT host, boot_id, 'blocked_waits' AS tbl, intDiv(seq, 1048576) AS block, groupBitmapState(seq) AS seqs, max(ts) AS last_ts FROM jitterscope.blocked_waits GROUP BY host, boot_id, block;

-- A request's time budget, from the thread that carried it (the group's
-- thread that lost the most time to waits of any kind during the request):
-- its blocked time by kind, and what is left, on the CPU (or in waits under
-- the probes' thresholds). `culprit` names the cause's culprit: the top
-- neighbour, the GIL holder thread, the waker of the I/O or memory stall.
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gil_wait_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS memory_wait_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS io_wait_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS sleep_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS on_cpu_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS thread_tid UInt32;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS culprit String DEFAULT '';

-- The span's thread.id: the thread that carried the request (0: not sent).
ALTER TABLE jitterscope.requests ADD COLUMN IF NOT EXISTS tid UInt32;

-- A process's memory cgroup: who shares its memory limit (the evictor of a
-- memory stall is looked for there first).
ALTER TABLE jitterscope.processes ADD COLUMN IF NOT EXISTS memory_cgroup String DEFAULT '';
