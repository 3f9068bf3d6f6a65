// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* migrate.h — the records the CPU-migration probe keeps, and its
 * tunables.
 *
 * BCC reads these layouts from the compiled program, so the Python side
 * never restates them (see collector/probes/migrate.py).
 */
#ifndef JITTERSCOPE_MIGRATE_H
#define JITTERSCOPE_MIGRATE_H

#include "common.h"  /* TASK_COMM_LEN, UNKNOWN_NODE */

/* Settings written by the collector into the `config` array map. */
struct migrate_config {
    u32 configured;     /* 0: nothing is counted yet (the probe attaches at load) */
    u32 filter_targets; /* 0: every thread; 1: only threads of tgids in `targets` */
};

/* What the probe knows of a thread: learned at clone and rename, or seeded
 * by the collector from /proc for threads older than the probe. */
struct task_info {
    u32 pid;            /* tgid */
    u32 _pad;
    char comm[TASK_COMM_LEN];
};

/* Per thread, cumulative since the probe started (the `counts` value). */
struct migrate_counts {
    u64 migrations;
    u64 cross_node;     /* of which changed NUMA node */
    u32 pid;            /* tgid, 0 = not known to the probe */
    u32 last_cpu;       /* where the last migration put it */
    u32 exited;         /* the thread is gone: the collector reads it one last time, then deletes it */
    u32 _pad;
    char comm[TASK_COMM_LEN];
};

#endif
