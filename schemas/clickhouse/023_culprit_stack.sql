-- SPDX-License-Identifier: Apache-2.0
-- 023: the culprit's stack (RequestAttribution.culprit_stack, a StackTrace.stack_id): what the top
-- neighbour of a runq_starvation request ran while it held the CPU of the request's longest wait
-- behind it (stacks are taken for waits worth an alert only; 0 = none captured). Join it with
-- `stacks` for the frames; the OTLP attribution span carries them as an event. Safe to re-run.
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS culprit_stack UInt64 DEFAULT 0;
