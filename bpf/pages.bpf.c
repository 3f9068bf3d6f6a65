// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* pages.bpf.c — which NUMA node a process's pages land on.
 *
 * Reads only tracepoint arguments and BPF helpers, never kernel structs: the
 * node of a page comes from its page frame number (a tracepoint argument)
 * and the pfn ranges of each node, which the collector reads from
 * /proc/zoneinfo and writes into `config` (no page_to_nid(), no struct page).
 *
 * Counted per (tgid of the current task, node), in pages (1 << order):
 *   - filemap:mm_filemap_add_to_page_cache: file pages a process brought into
 *     the page cache (reads, readahead, writes);
 *   - kmem:mm_page_alloc: every page allocation in the process's context.
 *     It fires on every allocation on the host, so its handler is one array
 *     look-up, at most MAX_PFN_RANGES compares, one hash look-up and an
 *     atomic add. Allocations from interrupts are charged to whatever task
 *     they interrupted (tgid 0 when the CPU was idle).
 * Nothing leaves the kernel one by one; the collector reads the counters.
 * A process's entries are freed after its exit has been read (`exited`).
 */
#include "pages.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

#ifndef MAX_KEYS  /* -DMAX_KEYS=... shrinks it (tests) */
#define MAX_KEYS 16384
#endif
#ifndef MAX_EXITED  /* -DMAX_EXITED=... shrinks it (tests) */
#define MAX_EXITED 4096
#endif
#define NO_PAGE (~0UL)  /* mm_page_alloc's pfn when the allocation failed */

BPF_ARRAY(config, struct pages_config, 1);
BPF_HASH(counts, struct page_key, struct page_counts, MAX_KEYS);
BPF_HASH(exited, u32, u8, MAX_EXITED);  /* tgids gone since the collector's last read */

static __always_inline void count_pages(u64 pfn, u32 order, int page_cache)
{
    int zero = 0;
    struct pages_config *cfg = config.lookup(&zero);
    if (!cfg || !cfg->configured)
        return;
    u32 node = UNKNOWN_NODE;
#pragma unroll
    for (int i = 0; i < MAX_PFN_RANGES; i++) {
        if (i >= cfg->nr_ranges)
            break;
        if (pfn >= cfg->ranges[i].start && pfn < cfg->ranges[i].end) {
            node = cfg->ranges[i].node;
            break;
        }
    }
    struct page_key key = {.pid = bpf_get_current_pid_tgid() >> 32, .node = node};
    struct page_counts *c = counts.lookup(&key);
    if (!c) {
        struct page_counts fresh = {};
        bpf_get_current_comm(&fresh.comm, sizeof(fresh.comm));
        counts.insert(&key, &fresh);  /* fails harmlessly if another CPU just did it */
        c = counts.lookup(&key);
        if (!c) {
            count_drop(DROP_MAP_FULL);  /* pages not counted: `counts` full */
            return;
        }
    }
    u64 pages = 1ULL << (order & 31);
    if (page_cache)
        __sync_fetch_and_add(&c->page_cache_pages, pages);
    else
        __sync_fetch_and_add(&c->alloc_pages, pages);
}

TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
    count_pages(args->pfn, args->order, 1);
    return 0;
}

TRACEPOINT_PROBE(kmem, mm_page_alloc)
{
    u64 pfn = args->pfn;
    if (pfn != NO_PAGE)
        count_pages(pfn, args->order, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    if (!args->group_dead)  /* a thread, not the last one */
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u8 one = 1;
    /* full: its counters stay until the collector's forget() (a slower path) */
    check_update(exited.update(&tgid, &one));
    return 0;
}
