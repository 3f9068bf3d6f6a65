// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* migrate.bpf.c — CPU migrations per thread, and those that change NUMA node.
 *
 * Reads only tracepoint arguments and BPF helpers, never kernel structs.
 *
 * sched_migrate_task fires in the context of whoever moves the task (the
 * waker choosing a CPU, the load balancer, a migration/N stopper thread), so
 * the current task says nothing about the migrated one; the tracepoint gives
 * only its tid (and its comm, whose layout differs across kernels: char[16]
 * before 6.x, __data_loc on 6.18). The thread's tgid and name therefore come
 * from `tasks`, learned where they are cheap and stable:
 *   - task_newtask (once per clone, in the parent: a new thread shares its
 *     tgid, a new process has its own) and task_rename (exec, prctl,
 *     pthread_setname_np) -- both rare, both fixed-layout on every kernel;
 *   - for threads older than the probe, the collector seeds the target
 *     processes' threads from /proc (set_targets), and resolves any thread the
 *     kernel does not know (pid 0) from /proc when it reads the counts.
 * Learning from sched_switch instead (as runq.bpf.c does) would add a second
 * program to the hottest tracepoint for a value needed only on migration.
 *
 * Counts are kept per thread in the kernel (`counts`); a move between CPUs of
 * different nodes (per `cpu_node`, written by the collector) is also counted
 * as cross-node in the same entry. Nothing leaves one by one: no consumer
 * used single cross-node moves (the per-thread count is what the rules and
 * tables read), so the ring buffer they went through is gone (see
 * collector/probes/migrate.py).
 */
#include "migrate.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

#define CLONE_THREAD 0x00010000

#ifndef MAX_THREADS  /* -DMAX_THREADS=... shrinks it (tests) */
#define MAX_THREADS 65536
#endif
#ifndef MAX_TARGETS  /* -DMAX_TARGETS=... shrinks it (tests) */
#define MAX_TARGETS 4096
#endif
#ifndef MAX_CPUS  /* -DMAX_CPUS=... shrinks it (tests) */
#define MAX_CPUS 8192
#endif

BPF_TABLE("lru_hash", u32, struct task_info, tasks, MAX_THREADS); /* tid -> tgid, comm */
BPF_HASH(counts, u32, struct migrate_counts, MAX_THREADS);         /* tid -> counts */
BPF_HASH(targets, u32, u8, MAX_TARGETS);                           /* tgids to watch when filtering */
/* cpu -> NUMA node; a hash, not an array, so that a CPU the collector left
 * out reads as unknown (never cross-node) rather than as node 0 */
BPF_HASH(cpu_node, u32, u32, MAX_CPUS);
BPF_ARRAY(config, struct migrate_config, 1);

static __always_inline u32 node_of(u32 cpu)
{
    u32 *node = cpu_node.lookup(&cpu);
    return node ? *node : UNKNOWN_NODE;
}

TRACEPOINT_PROBE(task, task_newtask)
{
    u32 tid = args->pid;
    struct task_info info = {
        .pid = (args->clone_flags & CLONE_THREAD) ? bpf_get_current_pid_tgid() >> 32 : tid,
    };
    __builtin_memcpy(info.comm, args->comm, TASK_COMM_LEN);
    check_update(tasks.update(&tid, &info));
    return 0;
}

TRACEPOINT_PROBE(task, task_rename)
{
    u32 tid = args->pid;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct task_info *known = tasks.lookup(&tid);
    if (known) {
        __builtin_memcpy(known->comm, args->newcomm, TASK_COMM_LEN);
    } else if ((u32)pid_tgid == tid) {  /* renaming itself: current says its tgid */
        struct task_info info = {.pid = pid_tgid >> 32};
        __builtin_memcpy(info.comm, args->newcomm, TASK_COMM_LEN);
        check_update(tasks.update(&tid, &info));
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tid = args->pid;
    tasks.delete(&tid);
    struct migrate_counts *c = counts.lookup(&tid);
    if (c)
        c->exited = 1;
    return 0;
}

TRACEPOINT_PROBE(sched, sched_migrate_task)
{
    u32 tid = args->pid;
    if (tid == 0)
        return 0;
    int zero = 0;
    struct migrate_config *cfg = config.lookup(&zero);
    if (!cfg || !cfg->configured)
        return 0;
    struct task_info *info = tasks.lookup(&tid);
    u32 tgid = info ? info->pid : 0;
    if (cfg->filter_targets && (tgid == 0 || !targets.lookup(&tgid)))
        return 0;

    u32 from_cpu = args->orig_cpu, to_cpu = args->dest_cpu;
    u32 from_node = node_of(from_cpu), to_node = node_of(to_cpu);
    u64 cross = from_node != to_node && from_node != UNKNOWN_NODE && to_node != UNKNOWN_NODE;

    struct migrate_counts *c = counts.lookup(&tid);
    if (!c) {
        struct migrate_counts fresh = {};
        counts.insert(&tid, &fresh);  /* fails harmlessly if another CPU just did it */
        c = counts.lookup(&tid);
        if (!c) {
            count_drop(DROP_MAP_FULL);  /* a migration not counted: `counts` full */
            return 0;
        }
    }
    __sync_fetch_and_add(&c->migrations, 1);
    if (cross)
        __sync_fetch_and_add(&c->cross_node, 1);
    c->last_cpu = to_cpu;
    if (info) {
        c->pid = tgid;
        __builtin_memcpy(c->comm, info->comm, TASK_COMM_LEN);
    }
    return 0;
}
