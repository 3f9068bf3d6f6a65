-- 008: a per-host, per-minute rollup of run-queue waits by victim command and
-- suspect command, so fleet questions about who starves inference threads
-- (saved query noisy-neighbours, the report's neighbour and action sections)
-- read ~1 row per host, minute and command pair instead of every raw event.
-- runq_events stays as it was: the raw rows are the drill-down.
--
-- Exact, like 004's rollups: runq_events is one of the sink's ROLLUP_SOURCES
-- (streams/sink.py), so a redelivered batch is dropped before this view fires,
-- and a host taken over after a crash has its last minutes rebuilt from the
-- FINAL source. The price is one key look-up per runq insert, read by the
-- sort key's (host, ts) prefix over the batch's time range only; measured in
-- bench/RESULTS.md (issue 13): 5-16 ms per 500-event batch, ~0.25x its insert.
--
-- neighbour marks waits behind another process (suspect_pid not 0 and not
-- the victim's own pid): the only ones fleet questions blame on a suspect.
-- Queries filter on whole minutes (minute > now() - since), so the oldest,
-- partial minute of a window is left out.

CREATE TABLE IF NOT EXISTS jitterscope.runq_minute (
    host LowCardinality(String),
    minute DateTime CODEC(Delta, ZSTD(1)),
    comm LowCardinality(String),
    suspect_comm LowCardinality(String),
    neighbour Bool,
    waits SimpleAggregateFunction(sum, UInt64),
    waited_ns SimpleAggregateFunction(sum, UInt64),
    max_wait_ns SimpleAggregateFunction(max, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (minute, host, comm, suspect_comm, neighbour);

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.runq_minute_mv TO jitterscope.runq_minute AS
SELECT host, toStartOfMinute(ts) AS minute, comm, suspect_comm,
       suspect_pid != 0 AND suspect_pid != pid AS neighbour,
       count() AS waits, sum(wait_ns) AS waited_ns, max(wait_ns) AS max_wait_ns
FROM jitterscope.runq_events
GROUP BY host, minute, comm, suspect_comm, neighbour;

-- Storage: run-queue events are the biggest table, so every column gets a
-- codec chosen by `bench/run.py storage` (bench/RESULTS.md, issue 13): seq is
-- consecutive per host (Delta), small integers keep only their used bits
-- (T64), strings' dictionary indexes compress with ZSTD; ts stays Delta
-- (DoubleDelta measured larger: gaps between tail events are random, not
-- regular). 13.2 -> 11.5 B per event at a 100M-events-a-day density. The
-- sort key stays (host, ts, boot_id, seq): (host, tid, ts) measured larger
-- (ts deltas grow within a thread) and would cost the sink's (host, ts) key
-- look-up its index. A codec change applies to parts written from now on and
-- to parts that merge; OPTIMIZE TABLE jitterscope.runq_events FINAL
-- recompresses old parts at once. Safe to re-run: it only restates codecs.
ALTER TABLE jitterscope.runq_events MODIFY COLUMN host CODEC(ZSTD(1)), MODIFY COLUMN boot_id CODEC(ZSTD(1)),
    MODIFY COLUMN seq CODEC(Delta, ZSTD(1)), MODIFY COLUMN pid CODEC(T64, ZSTD(1)),
    MODIFY COLUMN tid CODEC(T64, ZSTD(1)), MODIFY COLUMN comm CODEC(ZSTD(1)),
    MODIFY COLUMN cpu CODEC(T64, ZSTD(1)), MODIFY COLUMN suspect_pid CODEC(T64, ZSTD(1)),
    MODIFY COLUMN suspect_tid CODEC(T64, ZSTD(1)), MODIFY COLUMN suspect_comm CODEC(ZSTD(1));
