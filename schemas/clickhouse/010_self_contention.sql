-- 010: self-contention. A wait behind a thread of the request's own serving
-- group (more runnable threads than CPUs) is the group's doing, not a
-- neighbour's: attributions keep it apart from the suspects' share.

ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS self_wait_ns UInt64;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS self_threads UInt32;

-- The baseline learns each request's duration less its most-delayed
-- thread's run-queue waits: learned during contention, the plain duration
-- made the contention "normal" (a 54 ms request, 43 ms of it behind a hog,
-- judged against a 35 ms baseline had no excess to explain).
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS service_ns UInt64;

-- Which driver call stalled: the longest slow GPU ioctl's name (NV_ESC_RM_CONTROL, UVM_MIGRATE, ...).
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gpu_ioctl_call LowCardinality(String) DEFAULT '';
