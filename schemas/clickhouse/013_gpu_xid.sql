-- 013: Xid errors the NVIDIA driver logged to the kernel log (collector/probes/xid.py),
-- one row per NVRM Xid line, at the kernel's time of the line; and the Xid a
-- request's GPU logged during it (0: none), in its attribution.

CREATE TABLE IF NOT EXISTS jitterscope.gpu_xid (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    xid UInt16,
    pci LowCardinality(String),
    gpu LowCardinality(String),
    pid UInt32,
    comm LowCardinality(String),
    message String
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gpu_xid UInt16 DEFAULT 0;
