-- 005: the loss ledger. Every way a record can be lost is counted where it
-- happens (collector_stats) or kept (deadletter, now with the sending host).

ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS map_full_drops UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS spool_drops UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS spooled UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS producer_restarts UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS sent_by_topic Map(String, UInt64);
ALTER TABLE jitterscope.deadletter ADD COLUMN IF NOT EXISTS host LowCardinality(String) DEFAULT '';
