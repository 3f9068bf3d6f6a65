// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* pages.h — what the page-placement probe keeps, and its tunables.
 *
 * BCC reads these layouts from the compiled program, so the Python side
 * never restates them (see collector/probes/pages.py).
 */
#ifndef JITTERSCOPE_PAGES_H
#define JITTERSCOPE_PAGES_H

#include "common.h"  /* TASK_COMM_LEN, UNKNOWN_NODE */
#define MAX_PFN_RANGES 16

/* [start, end) page frames on one NUMA node (one or more merged zones). */
struct pfn_range {
    u64 start;
    u64 end;
    u32 node;
    u32 _pad;
};

/* Settings written by the collector into the `config` array map: one look-up
 * brings every range. */
struct pages_config {
    u32 configured;     /* 0: nothing is counted yet (the probe attaches at load) */
    u32 nr_ranges;      /* valid entries of ranges[] */
    struct pfn_range ranges[MAX_PFN_RANGES];
};

/* Pages one process put on one node (the `counts` key). */
struct page_key {
    u32 pid;            /* tgid of the task in whose context the page came */
    u32 node;
};

/* Cumulative since the probe started (the `counts` value). */
struct page_counts {
    u64 page_cache_pages;   /* filemap:mm_filemap_add_to_page_cache, 1 << order each */
    u64 alloc_pages;        /* kmem:mm_page_alloc, 1 << order each */
    char comm[TASK_COMM_LEN]; /* the thread that created the entry */
};

#endif
