// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* blockio.h — what the block-I/O probe keeps per device, and its tunables.
 *
 * BCC reads these layouts from the compiled program, so the Python side
 * never restates them (see collector/probes/blockio.py).
 */
#ifndef JITTERSCOPE_BLOCKIO_H
#define JITTERSCOPE_BLOCKIO_H

/* Settings written by the collector into the `config` array map. */
struct blockio_config {
    u32 epoch;          /* 0: nothing is counted yet; bumped by the collector at each read */
    u32 _pad;
};

/* A request between block_rq_issue and block_rq_complete (the `in_flight` key). */
struct rq_key {
    u32 dev;            /* kernel dev_t: major << 20 | minor, the whole disk */
    u32 _pad;
    u64 sector;
};

struct rq_start {
    u64 ts_ns;          /* CLOCK_MONOTONIC at issue */
    u64 bytes;          /* still to complete (a request may complete in parts) */
};

/* Per device, per CPU (the `stats` value). Sums are cumulative since the
 * probe started; the maximum is kept per read interval: the kernel writes
 * max_ns[epoch & 1], and the collector, after bumping the epoch, reads the
 * other slot, which no longer changes. */
struct dev_stats {
    u64 ios;            /* requests completed (issued while the probe ran) */
    u64 bytes;
    u64 latency_sum_ns; /* issue -> completion */
    u64 errors;         /* completions with an error */
    u64 max_ns[2];
    u32 max_epoch[2];   /* the epoch each max_ns slot belongs to */
};

#endif
