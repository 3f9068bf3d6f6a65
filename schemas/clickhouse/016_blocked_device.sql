-- SPDX-License-Identifier: Apache-2.0
-- An io block carries its device (BlockedWait.device): the block device of the
-- last I/O the thread queued before it slept, the culprit of an io_wait
-- request. '' for other kinds, and for rows from older collectors.
ALTER TABLE jitterscope.blocked_waits ADD COLUMN IF NOT EXISTS device LowCardinality(String) DEFAULT '';
