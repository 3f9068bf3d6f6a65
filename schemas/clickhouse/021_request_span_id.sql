-- SPDX-License-Identifier: Apache-2.0
-- 021: the request's own span id (RequestAttribution.span_id, hex), so its attribution can be sent
-- back into the user's trace as a child of that span (streams/otlp_export.py). Empty for rows
-- written before. Safe to re-run.
ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS span_id String DEFAULT '' AFTER trace_id;
