-- Page counts carry the process's memory cgroup (PagePlacement.memory_cgroup):
-- the evictor of a memory stall is looked for among the processes under the
-- stalled one's limit, and a process record (another topic) may come late or,
-- for a short-lived process, never. '' for rows from older collectors.
ALTER TABLE jitterscope.page_placement ADD COLUMN IF NOT EXISTS memory_cgroup LowCardinality(String) DEFAULT '';
