-- SPDX-License-Identifier: Apache-2.0
-- 021: the request's own span id (RequestAttribution.span_id, hex), so its attribution can be sent
-- back into the user's trace as a child of that span (streams/otlp_export.py); and its phases
-- (RequestAttribution.phases, streams/phases.py): each phase its span gave (queue, prefill, decode),
-- how long it took, the cause that took the most of it (cause_ns of it, culprit) and the carrying
-- thread's run-queue and stall time in it; and the token objectives (streams/token_slo.py): the
-- span's model and output tokens, the request's TTFT and mean inter-token latency, and which of
-- ttft_slo_ms / itl_slo_ms it broke. Empty for rows written before. Safe to re-run.
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS span_id String DEFAULT '' AFTER trace_id;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS
    phases Array(Tuple(phase LowCardinality(String), ns UInt64, cause LowCardinality(String), cause_ns UInt64,
                       culprit String, runq_ns UInt64, gil_ns UInt64, memory_ns UInt64, io_ns UInt64)) DEFAULT [];
ALTER TABLE jitterscope.requests ADD COLUMN IF NOT EXISTS model LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.requests ADD COLUMN IF NOT EXISTS output_tokens UInt32 DEFAULT 0;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS model LowCardinality(String) DEFAULT '';
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS ttft_ns UInt64 DEFAULT 0;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS itl_ns UInt64 DEFAULT 0;
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS
    token_slo_breached Array(LowCardinality(String)) DEFAULT [];
