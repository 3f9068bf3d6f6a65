-- SPDX-License-Identifier: Apache-2.0
-- A run-queue row may stand for several waits (RunqEvent.waits): a serving
-- thread's waits under its threshold, each too short to send alone, summed
-- per burst (bpf/runq.bpf.c add_short_wait); wait_ns is their total and ts
-- the last one's end. 1 for every other row, and for rows from older
-- collectors. runq_minute counts rows, so a sum is one of its `waits` and
-- adds its total to `waited_ns`.
ALTER TABLE jitterscope.runq_events ADD COLUMN IF NOT EXISTS waits UInt32 DEFAULT 1;
