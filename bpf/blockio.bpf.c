// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* blockio.bpf.c — traffic and latency of each block device.
 *
 * Reads only tracepoint arguments and BPF helpers, never kernel structs. A
 * request is matched from block:block_rq_issue to block:block_rq_complete by
 * (dev, sector); it is counted at completion: one I/O, its completed bytes,
 * its issue -> completion latency. A request that completes in parts (the
 * tracepoint fires per part, the sector advancing) stays in flight under its
 * next sector until its last part.
 *
 * Statistics are per-CPU values (no atomics on the completion path; a
 * tracepoint program never nests on one CPU), summed by the collector.
 * Nothing leaves the kernel one by one.
 */
#include "blockio.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

#ifndef MAX_IN_FLIGHT  /* -DMAX_IN_FLIGHT=... shrinks it (tests) */
#define MAX_IN_FLIGHT 16384
#endif
#ifndef MAX_DEVICES  /* -DMAX_DEVICES=... shrinks it (tests) */
#define MAX_DEVICES 1024
#endif
#define SECTOR_SHIFT 9

BPF_ARRAY(config, struct blockio_config, 1);
/* LRU: requests issued before a crash of the collector or whose completion
 * was never traced must not fill the table. */
BPF_TABLE("lru_hash", struct rq_key, struct rq_start, in_flight, MAX_IN_FLIGHT);
BPF_PERCPU_HASH(stats, u32, struct dev_stats, MAX_DEVICES);

TRACEPOINT_PROBE(block, block_rq_issue)
{
    int zero = 0;
    struct blockio_config *cfg = config.lookup(&zero);
    if (!cfg || cfg->epoch == 0)
        return 0;
    struct rq_key key = {.dev = args->dev, ._pad = 0, .sector = args->sector};
    struct rq_start start = {.ts_ns = bpf_ktime_get_ns(), .bytes = args->bytes};
    check_update(in_flight.update(&key, &start));
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    struct rq_key key = {.dev = args->dev, ._pad = 0, .sector = args->sector};
    struct rq_start *start = in_flight.lookup(&key);
    if (!start)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 issued = start->ts_ns;
    u64 left = start->bytes;
    u32 nr_sector = args->nr_sector;
    u64 done = (u64)nr_sector << SECTOR_SHIFT;
    in_flight.delete(&key);
    if (done > 0 && done < left && args->error == 0) {  /* a part: wait for the rest */
        struct rq_key next = {.dev = key.dev, ._pad = 0, .sector = key.sector + nr_sector};
        struct rq_start rest = {.ts_ns = issued, .bytes = left - done};
        check_update(in_flight.update(&next, &rest));
    }

    int zero = 0;
    struct blockio_config *cfg = config.lookup(&zero);
    if (!cfg || cfg->epoch == 0)
        return 0;
    u32 dev = key.dev;
    struct dev_stats *s = stats.lookup(&dev);
    if (!s) {
        struct dev_stats fresh = {};
        stats.insert(&dev, &fresh);
        s = stats.lookup(&dev);
        if (!s) {
            count_drop(DROP_MAP_FULL);  /* a completion not counted: `stats` full */
            return 0;
        }
    }
    s->bytes += done;
    if (done > 0 && done < left && args->error == 0)
        return 0;  /* the I/O and its latency count at its last part */
    u64 latency_ns = now - issued;
    s->ios++;
    s->latency_sum_ns += latency_ns;
    if (args->error)
        s->errors++;
    u32 epoch = cfg->epoch;
    u32 slot = epoch & 1;
    if (s->max_epoch[slot] != epoch) {
        s->max_epoch[slot] = epoch;
        s->max_ns[slot] = latency_ns;
    } else if (latency_ns > s->max_ns[slot]) {
        s->max_ns[slot] = latency_ns;
    }
    return 0;
}
