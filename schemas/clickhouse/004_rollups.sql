-- 004: per-host, per-minute rollups for fleet questions, maintained by
-- materialized views as rows arrive. Quantiles come from the log2
-- histograms (every wait, not only the tail events), weighted by count, with
-- each bucket at its geometric middle (2^slot * 1.5 us).
--
-- A materialized view sees each insert once: a batch that Kafka redelivers
-- is counted again here although FINAL hides it in the source table. The
-- rollups are for trends; exact per-record answers come from the tables.

CREATE TABLE IF NOT EXISTS jitterscope.latency_minute (
    host LowCardinality(String),
    probe LowCardinality(String),
    minute DateTime CODEC(Delta, ZSTD(1)),
    quantiles AggregateFunction(quantilesTDigestWeighted(0.5, 0.99, 0.999), Float64, UInt64),
    observations SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (probe, host, minute);

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.latency_minute_mv TO jitterscope.latency_minute AS
SELECT host, probe, toStartOfMinute(ts) AS minute,
       quantilesTDigestWeightedState(0.5, 0.99, 0.999)(pow(2, slot) * 1.5, count) AS quantiles,
       sum(count) AS observations
FROM jitterscope.latency_histograms
ARRAY JOIN slots AS slot, counts AS count
GROUP BY host, probe, minute;

CREATE TABLE IF NOT EXISTS jitterscope.attribution_minute (
    host LowCardinality(String),
    cause LowCardinality(String),
    minute DateTime CODEC(Delta, ZSTD(1)),
    requests SimpleAggregateFunction(sum, UInt64),
    over_slo SimpleAggregateFunction(sum, UInt64),
    excess_ns SimpleAggregateFunction(sum, UInt64),
    duration_quantiles AggregateFunction(quantiles(0.5, 0.99, 0.999), UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (cause, host, minute);

CREATE MATERIALIZED VIEW IF NOT EXISTS jitterscope.attribution_minute_mv TO jitterscope.attribution_minute AS
SELECT host, cause, toStartOfMinute(ts) AS minute, count() AS requests,
       countIf(slo_breached) AS over_slo, sum(excess_ns) AS excess_ns,
       quantilesState(0.5, 0.99, 0.999)(duration_ns) AS duration_quantiles
FROM jitterscope.request_attribution
GROUP BY host, cause, minute;
