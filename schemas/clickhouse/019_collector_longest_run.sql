-- SPDX-License-Identifier: Apache-2.0
-- 019: the collector's longest run on a CPU per stats interval
-- (CollectorStats.longest_run_ns, collector/pacing.py): a burst of its own
-- work is a wait it causes a serving thread; the report's "Cost of watching"
-- shows it. Rows from older collectors read 0 (not measured). Safe to re-run.
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS longest_run_ns UInt64 DEFAULT 0;
