-- 010: self-contention. A wait behind a thread of the request's own serving
-- group (more runnable threads than CPUs) is the group's doing, not a
-- neighbour's: attributions keep it apart from the suspects' share.

ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS self_wait_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS self_threads UInt32;
