-- 006: what jitterscope itself costs on each host (collector/selfcost.py):
-- the collector's CPU time and RSS, its BPF programs' run time and runs (the
-- kernel's BPF statistics), and the overhead share over the stats interval.

ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS cpu_ns UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS rss_bytes UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS bpf_run_ns UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS bpf_run_count UInt64;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS bpf_run_ns_by_program Map(String, UInt64);
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS bpf_run_count_by_program Map(String, UInt64);
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS online_cpus UInt16;
ALTER TABLE jitterscope.collector_stats ADD COLUMN IF NOT EXISTS overhead_share Float64;
