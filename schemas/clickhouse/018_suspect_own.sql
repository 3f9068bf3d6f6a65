-- SPDX-License-Identifier: Apache-2.0
-- 018: whether a run-queue wait's suspect is jitterscope's own process
-- (RunqEvent.suspect_own). The collector knows its own processes by pid; a
-- name proves nothing (`cp /bin/yes /tmp/jitterscope:up` takes the label's
-- spelling), so the stacks report leaves out own culprits by this column.
-- Rows written before it existed were labelled by the collector alone, so
-- for them the label is the evidence there is: the DEFAULT reads it. Every
-- new row carries the collector's value. Safe to re-run.
ALTER TABLE jitterscope.runq_events ADD COLUMN IF NOT EXISTS suspect_own Bool DEFAULT startsWith(suspect_comm, 'jitterscope:');
