-- SPDX-License-Identifier: Apache-2.0
-- 024: a process's last page counts say it exited (PagePlacement.exited): the evictor of a memory
-- stall is never a process that exited before the request began, whose allocations were freed (the
-- archiver of an earlier cron run). Safe to re-run.
ALTER TABLE jitterscope.page_placement ADD COLUMN IF NOT EXISTS exited Bool DEFAULT false;
