-- 014: each GPU's NVML readings per nvml_interval_s (collector/probes/nvml.py):
-- clocks, the clock-throttle reasons (bitmask and decoded names), temperature,
-- power, PCIe throughput, NVLink errors in the interval; and the slowdowns
-- a request's GPU had during it, in its attribution.

CREATE TABLE IF NOT EXISTS jitterscope.gpu_telemetry (
    host LowCardinality(String),
    boot_id LowCardinality(String),
    seq UInt64,
    ts DateTime64(9) CODEC(Delta, ZSTD(1)),
    pci LowCardinality(String),
    gpu LowCardinality(String),
    interval_ns UInt64,
    sm_clock_mhz UInt32,
    mem_clock_mhz UInt32,
    sm_clock_max_mhz UInt32,
    throttle_reasons UInt64,
    throttle Array(LowCardinality(String)),
    temperature_c UInt16,
    power_mw UInt32,
    pcie_tx_kbps UInt32,
    pcie_rx_kbps UInt32,
    nvlink_errors UInt64
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (host, ts, boot_id, seq);

ALTER TABLE jitterscope.request_attribution ADD COLUMN IF NOT EXISTS gpu_throttle Array(LowCardinality(String)) DEFAULT [];
