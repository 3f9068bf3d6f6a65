// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* runq.bpf.c — run-queue latency per thread: wakeup (or preemption) to on-CPU.
 *
 * Reads only tracepoint arguments and BPF helpers, never kernel structs: BCC
 * takes tracepoint layouts from tracefs at run time, so this stays correct
 * even when the installed headers do not match the running kernel.
 *
 * Every wait goes into a per-process log2 histogram (the full distribution);
 * waits at or above config.threshold_ns also leave as one ring-buffer event
 * each, naming a suspect: of the last RECENT_RUNS tasks on the waiter's CPU,
 * the one that ran longest during the wait. (The task that ran last is often
 * a kernel thread that woke for a moment; blaming it would hide the hog.)
 *
 * A serving process's thread (one with a threshold of its own) also sends
 * its waits under that threshold, summed per burst (add_short_wait): each is
 * too short to matter alone, but together they are part of its requests'
 * time, which would otherwise count as time on the CPU.
 *
 * Stacks (config.stacks) are taken only where an event can use them, for
 * waits of config.stacks_from_us or more (the collector: the alert level),
 * because a stack walk costs far more than the rest of a switch (a real
 * vLLM's threads on 2 CPUs wait over their 1 ms threshold all the time:
 * with a stack each, its P99 was 1.8x without the collector, 1.2x without
 * stacks):
 *  - the suspect's, at the switch into a waiter whose wait is over its
 *    threshold, when the suspect is the task giving up the CPU (current ==
 *    prev there, so its own user stack is readable);
 *  - the waiter's, when it is preempted (current == prev again), only for
 *    threads whose waits are explained to a person (serving processes, with
 *    a threshold of their own, and explicitly filtered targets) that waited
 *    that long within the last LONG_WAIT_WINDOW_NS: threads being
 *    starved now (the first long wait goes without). It waits in the
 *    thread's own slot of `victim_stacks` (LRU: never full), stamped with
 *    the time the wait began, until the wait turns out long.
 * Both travel inside the event (bpf_get_stack), not as BPF_STACK_TRACE ids:
 * a stack map is a hash table of one stack per bucket, and a stack that lands
 * on a taken bucket is lost (or, with BPF_F_REUSE_STACKID, silently replaces
 * one an event still names). With 1024-4096 buckets and the collector reading
 * and deleting within milliseconds, tests here still lost a stack now and
 * then; unread victim stacks (most preemptions end in a short wait) made it
 * worse. And read from the slot by the collector instead of from the event,
 * most victim stacks were already overwritten: a starved thread is preempted
 * again within milliseconds of getting the CPU. An event with stacks is
 * ~4 KiB; such events are the rare ones, over the threshold.
 *
 * Per switch and wakeup the work is map look-ups and stores in place, never a
 * hash insert or delete (those take a lock and a free-list element, and cost
 * more than the rest together): one `threads` slot per thread holds its tgid
 * and when it became runnable (0: not waiting). A wakeup stamps the slot, the
 * switch into the thread reads and clears it; a slot is inserted only for a
 * thread not seen before and deleted when the thread exits.
 */
#include "runq.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

/* sched_switch reports a preempted, still-runnable task with this bit
 * (TASK_REPORT_MAX) in prev_state; a voluntary sleep sets a state bit. */
#define PREEMPT_STATE_BIT 0x100
#define CLONE_THREAD 0x00010000

#ifndef MAX_THREADS  /* -DMAX_THREADS=... shrinks it (tests) */
#define MAX_THREADS 65536
#endif
#ifndef MAX_TARGETS  /* -DMAX_TARGETS=... shrinks it (tests) */
#define MAX_TARGETS 4096
#endif
#ifndef MAX_HIST_KEYS  /* -DMAX_HIST_KEYS=... shrinks it (tests) */
#define MAX_HIST_KEYS 16384
#endif
#ifndef MAX_VICTIM_THREADS  /* starved threads with a stack slot; ~2 KiB each */
#define MAX_VICTIM_THREADS 1024
#endif
#define LONG_WAIT_WINDOW_NS 1000000000ULL
#ifndef MAX_LONG_WAITERS
#define MAX_LONG_WAITERS 4096
#endif

/* tid -> its tgid (learned) and when it became runnable (LRU: never "full") */
BPF_TABLE("lru_hash", u32, struct thread_state, threads, MAX_THREADS);
/* tgid -> its own event threshold in ns (0 = the global one). The tgids to
 * watch when filtering; with or without filtering, serving processes get a
 * finer threshold here so their requests can be explained. */
BPF_HASH(targets, u32, u64, MAX_TARGETS);
BPF_ARRAY(config, struct runq_config, 1);
BPF_HASH(hist, struct runq_hist_key, u64, MAX_HIST_KEYS);
BPF_PERCPU_ARRAY(recent, struct cpu_runs, 1);       /* per-CPU run history */
/* 4096 pages = 16 MiB: ~150,000 events without stacks, ~4,000 with, so a reader
 * stalled for a moment (a burst of a real vLLM's sleeps to decode, a new
 * process's symbol tables to load) loses none. Every event once took 4 KiB:
 * beside a real vLLM the collector lost 10% of its events to a full buffer. */
BPF_RINGBUF_OUTPUT(events, 4096);
BPF_PERCPU_ARRAY(event_scratch, struct runq_event, 1);  /* a switch's event, copied out at its size */
#define WAKEUP_EVENTS 128  /* events from one CPU that wake the reader at once */
BPF_TABLE("lru_hash", u32, struct victim_stack, victim_stacks, MAX_VICTIM_THREADS); /* tid -> its stacks */
BPF_PERCPU_ARRAY(victim_blank, struct victim_stack, 1);  /* a zeroed value to create slots from */
/* tid -> when it last waited over its threshold (written only with an event) */
BPF_TABLE("lru_hash", u32, u64, long_waits, MAX_LONG_WAITERS);
/* serving thread -> its short waits not sent yet (inserted once per thread) */
BPF_TABLE("lru_hash", u32, struct short_waits, short_waits, MAX_VICTIM_THREADS);

/* Until the collector has written the config (threshold 0), nothing is
 * tracked: the probe attaches at load, before its filters are set. */
static __always_inline int is_target(u32 tgid)
{
    int zero = 0;
    struct runq_config *cfg = config.lookup(&zero);
    if (!cfg || cfg->threshold_ns == 0)
        return 0;
    if (!cfg->filter_targets)
        return 1;
    return tgid != 0 && targets.lookup(&tgid) != 0;
}

/* The current (preempted) thread's stacks into its victim_stacks slot. */
static __always_inline int save_victim_stack(void *ctx, u32 tid, u64 now)
{
    int zero = 0;
    struct victim_stack *blank = victim_blank.lookup(&zero);
    if (!blank)
        return 0;
    struct victim_stack *v = victim_stacks.lookup_or_try_init(&tid, blank);
    if (!v) {
        count_drop(DROP_MAP_FULL);
        return 0;
    }
    v->started_ns = now;
    v->kernel_bytes = bpf_get_stack(ctx, v->kernel, sizeof(v->kernel), 0);
    v->user_bytes = bpf_get_stack(ctx, v->user, sizeof(v->user), BPF_F_USER_STACK);
    return 1;
}

/* Whether a (watched) thread's preemption is worth its stack: it is
 * explained to a person and is being starved now (see the top). */
static __always_inline int wants_victim_stack(struct runq_config *cfg, u32 tid, u32 tgid, u64 now)
{
    if (!cfg->stacks)
        return 0;
    if (!cfg->filter_targets) {  /* with filtering, is_target found it: chosen explicitly */
        if (!cfg->has_overrides)
            return 0;
        u64 *own = targets.lookup(&tgid);
        if (!own || !*own)
            return 0;
    }
    u64 *last = long_waits.lookup(&tid);
    return last && now - *last < LONG_WAIT_WINDOW_NS;
}

static __always_inline void mark_runnable(u32 tid, u64 now)
{
    int zero = 0;
    struct runq_config *cfg = config.lookup(&zero);
    if (tid == 0 || !cfg || cfg->threshold_ns == 0)
        return;
    struct thread_state *t = threads.lookup(&tid);
    if (!t) {  /* never seen: its tgid is learned when it next leaves a CPU */
        if (!cfg->filter_targets) {
            struct thread_state fresh = {.enqueued_ns = now};
            check_update(threads.update(&tid, &fresh));
        }
        return;
    }
    if (cfg->filter_targets && !is_target(t->tgid))
        return;
    t->enqueued_ns = now;
    t->has_stack = 0;
}

/* Of the CPU's recent runs, the one that overlapped a wait from
 * ``waited_from`` the most, the waiter's own and the idle task's aside:
 * its index, -1 when none did. */
static __always_inline int busiest_run(struct cpu_runs *cpu, u32 tid, u64 waited_from)
{
    u64 best = 0;
    int best_i = -1;
#pragma unroll
    for (int i = 0; i < RECENT_RUNS; i++) {
        struct cpu_run *run = &cpu->runs[i];
        u64 from = run->start_ns > waited_from ? run->start_ns : waited_from;
        u64 overlap = run->end_ns > from ? run->end_ns - from : 0;
        if (run->tid != tid && run->tid != 0 && overlap > best) {
            best = overlap;
            best_i = i;
        }
    }
    return best_i;
}

/* Wake the reader for a batch, not for every event: a wakeup each cost
 * the collector a syscall and a context switch per event. It polls every
 * 50 ms anyway (collector/agent.py), so an event waits at most that --
 * except an ``urgent`` one (a wait the worker alerts on), which wakes it
 * now: the poll was half of such an alert's delay.
 * (BCC 0.26 has no ringbuf_query to wake by pending bytes: count per CPU.) */
static __always_inline u64 wakeup_flags(struct cpu_runs *cpu, int urgent)
{
    if (cpu && (urgent || ++cpu->unannounced >= WAKEUP_EVENTS)) {
        cpu->unannounced = 0;
        return BPF_RB_FORCE_WAKEUP;
    }
    return BPF_RB_NO_WAKEUP;
}

static __always_inline void clear_short_waits(struct short_waits *held)
{
    held->last_ns = held->sum_ns = held->longest_ns = 0;
    held->count = 0;
}

/* A serving thread's held short waits leave as one event (waits > 1, no
 * stacks), stamped with the last one's end. ``comm``: the thread's name. */
static __always_inline void send_short_waits(const char *comm, struct cpu_runs *cpu, struct short_waits *held,
                                             u32 tid, u32 tgid)
{
    struct runq_event *ev = events.ringbuf_reserve(RUNQ_EVENT_HEAD_SIZE);
    if (ev) {
        ev->ts_ns = held->last_ns;
        ev->wait_ns = held->sum_ns;
        ev->pid = tgid;
        ev->tid = tid;
        ev->cpu = held->cpu;
        ev->suspect_pid = held->suspect_pid;
        ev->suspect_tid = held->suspect_tid;
        ev->waits = held->count;
        bpf_probe_read_kernel(&ev->comm, sizeof(ev->comm), comm);
        __builtin_memcpy(ev->suspect_comm, held->suspect_comm, TASK_COMM_LEN);
        ev->victim_kernel_bytes = ev->victim_user_bytes = -1;
        ev->suspect_kernel_bytes = ev->suspect_user_bytes = -1;
        events.ringbuf_submit(ev, wakeup_flags(cpu, 0));
    } else {
        count_drop(DROP_RINGBUF);
    }
    clear_short_waits(held);
}

/* A serving thread's wait under its threshold: too short to send alone, but
 * a GIL-bound thread has dozens of them per request (each hand-off wakes an
 * idle CPU: ~35 us on a VM, 1-2 ms a request), which its time budget would
 * otherwise count as time on the CPU. Held per thread and sent summed, once
 * they reach the threshold or when the next one comes over
 * SHORT_WAIT_GAP_NS later (so a sum stays inside one burst, e.g. one
 * request) -- then only if at least 1/SHORT_WAIT_MIN_PART of the threshold,
 * so that a thread waking every few ms costs no event per wake-up; a thread
 * that never waits again keeps its last sum unsent. The
 * sum's suspect is that of its longest wait (the prev task by default: the
 * idle task for a wake-up of an idle CPU). */
struct switch_names {  /* the tracepoint's names, for helpers called before its args type exists */
    const char *prev_comm;
    const char *next_comm;
    u32 prev_tid;
};

static __always_inline void add_short_wait(struct switch_names *sw, struct cpu_runs *cpu, u32 tid, u32 tgid,
                                           u64 now, u64 wait_ns, u64 threshold)
{
    struct short_waits *held = short_waits.lookup(&tid);
    if (!held) {
        struct short_waits none = {};
        check_update(short_waits.update(&tid, &none));
        held = short_waits.lookup(&tid);
        if (!held)
            return;
    }
    if (held->count && now - wait_ns - held->last_ns > SHORT_WAIT_GAP_NS) {
        if (held->sum_ns * SHORT_WAIT_MIN_PART >= threshold)
            send_short_waits(sw->next_comm, cpu, held, tid, tgid);
        else
            clear_short_waits(held);  /* too little to send: dropped */
    }
    held->sum_ns += wait_ns;
    held->last_ns = now;
    held->count++;
    if (wait_ns > held->longest_ns) {
        held->longest_ns = wait_ns;
        held->cpu = bpf_get_smp_processor_id();
        held->suspect_pid = bpf_get_current_pid_tgid() >> 32;  /* current is still prev here */
        held->suspect_tid = sw->prev_tid;
        bpf_probe_read_kernel(&held->suspect_comm, sizeof(held->suspect_comm), sw->prev_comm);
        int i = cpu ? busiest_run(cpu, tid, now - wait_ns) : -1;
        if (cpu && i >= 0 && i < RECENT_RUNS) {
            struct cpu_run *run = &cpu->runs[i];
            held->suspect_pid = run->pid;
            held->suspect_tid = run->tid;
            __builtin_memcpy(held->suspect_comm, run->comm, TASK_COMM_LEN);
        }
    }
    if (held->sum_ns >= threshold)
        send_short_waits(sw->next_comm, cpu, held, tid, tgid);
}

TRACEPOINT_PROBE(task, task_newtask)
{
    /* Runs in the parent: a new thread shares its tgid, a new process has its own. */
    u32 tid = args->pid;
    struct thread_state fresh = {
        .tgid = (args->clone_flags & CLONE_THREAD) ? bpf_get_current_pid_tgid() >> 32 : tid};
    check_update(threads.update(&tid, &fresh));
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    mark_runnable(args->pid, bpf_ktime_get_ns());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    mark_runnable(args->pid, bpf_ktime_get_ns());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tid = args->pid;
    threads.delete(&tid);
    short_waits.delete(&tid);  /* an exiting thread's last sum stays unsent */
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u32 prev_tid = args->prev_pid;
    u32 prev_tgid = bpf_get_current_pid_tgid() >> 32; /* current is still prev here */

    int zero = 0;
    struct cpu_runs *cpu = recent.lookup(&zero);
    if (cpu) {
        struct cpu_run *slot = &cpu->runs[cpu->next & (RECENT_RUNS - 1)];
        slot->start_ns = cpu->since_ns;
        slot->end_ns = now;
        slot->pid = prev_tgid;
        slot->tid = prev_tid;
        __builtin_memcpy(slot->comm, args->prev_comm, TASK_COMM_LEN);
        cpu->next++;
        cpu->since_ns = now;
    }

    if (prev_tid != 0) {
        /* Preempted: it waits again. Going to sleep: it does not wait until
         * its wakeup stamps it (a stamp from a wakeup while it ran is stale). */
        int preempted = (args->prev_state & ~(long)PREEMPT_STATE_BIT) == 0;
        struct thread_state *t = threads.lookup(&prev_tid);
        if (!t || t->tgid != prev_tgid) {  /* a thread from before the probe, or a reused tid */
            struct thread_state learned = {.tgid = prev_tgid};
            check_update(threads.update(&prev_tid, &learned));
            t = threads.lookup(&prev_tid);
        }
        if (t && preempted && is_target(prev_tgid)) {
            struct runq_config *cfg = config.lookup(&zero);
            t->has_stack = cfg && wants_victim_stack(cfg, prev_tid, prev_tgid, now)
                ? save_victim_stack(args, prev_tid, now) : 0;
            t->enqueued_ns = now;
        } else if (t && t->enqueued_ns) {
            t->enqueued_ns = 0;
        }
    }

    u32 tid = args->next_pid;
    if (tid == 0)
        return 0;
    struct thread_state *since = threads.lookup(&tid);
    if (!since || !since->enqueued_ns)
        return 0;
    u64 wait_ns = now - since->enqueued_ns;
    u32 has_stack = since->has_stack;
    u32 tgid = since->tgid;
    since->enqueued_ns = 0;

    if (!is_target(tgid))   /* targets may have changed since it was queued */
        return 0;
    /* BCC's bpf_log2l(v) is floor(log2(v)) + 1 for v >= 1 (0 for 0): one
     * less is the bucket [2^slot, 2^(slot+1)) us that runq.h and the
     * LatencyHistogram record promise (libbpf-tools runqlat's convention;
     * < 1 us in slot 0 too). */
    u64 wait_us = wait_ns / 1000;
    struct runq_hist_key key = {.pid = tgid, .slot = wait_us ? bpf_log2l(wait_us) - 1 : 0};
    u64 none = 0;
    /* insert-if-absent, then add: two CPUs creating the same key both count */
    u64 *count = hist.lookup_or_try_init(&key, &none);
    if (count)
        __sync_fetch_and_add(count, 1);
    else
        count_drop(DROP_MAP_FULL);

    struct runq_config *cfg = config.lookup(&zero);
    if (!cfg)
        return 0;
    u64 threshold = cfg->threshold_ns;
    int serving = 0;  /* a process with a threshold of its own: one whose requests are explained */
    if (cfg->has_overrides) {
        u64 *own = targets.lookup(&tgid);
        if (own && *own) {
            threshold = *own;
            serving = 1;
        }
    }
    if (wait_ns < threshold) {
        if (serving) {
            struct switch_names sw = {.prev_comm = args->prev_comm, .next_comm = args->next_comm,
                                      .prev_tid = prev_tid};
            add_short_wait(&sw, cpu, tid, tgid, now, wait_ns, threshold);
        }
        return 0;
    }
    int stack_worthy = cfg->stacks && wait_ns >= cfg->stacks_from_us * 1000ULL;
    if (stack_worthy)  /* its next preemptions are worth a stack (LRU: never "full") */
        long_waits.update(&tid, &now);

    struct runq_event *ev = event_scratch.lookup(&zero);
    if (!ev)
        return 0;
    ev->ts_ns = now;
    ev->wait_ns = wait_ns;
    ev->pid = tgid;
    ev->tid = tid;
    ev->cpu = bpf_get_smp_processor_id();
    ev->waits = 1;
    bpf_probe_read_kernel(&ev->comm, sizeof(ev->comm), args->next_comm);
    /* the suspect: the recent run that overlapped the wait the most */
    ev->suspect_pid = prev_tgid;
    ev->suspect_tid = prev_tid;
    bpf_probe_read_kernel(&ev->suspect_comm, sizeof(ev->suspect_comm), args->prev_comm);
    ev->victim_kernel_bytes = -1;
    ev->victim_user_bytes = -1;
    if (has_stack) {
        struct victim_stack *v = victim_stacks.lookup(&tid);
        if (v && v->started_ns == now - wait_ns) {  /* not evicted and reused by another thread */
            ev->victim_kernel_bytes = v->kernel_bytes;
            ev->victim_user_bytes = v->user_bytes;
            bpf_probe_read_kernel(ev->victim_kernel, sizeof(ev->victim_kernel), v->kernel);
            bpf_probe_read_kernel(ev->victim_user, sizeof(ev->victim_user), v->user);
        }
    }
    if (cpu) {
        int best_i = busiest_run(cpu, tid, now - wait_ns);
        if (best_i >= 0 && best_i < RECENT_RUNS) {
            struct cpu_run *run = &cpu->runs[best_i];
            ev->suspect_pid = run->pid;
            ev->suspect_tid = run->tid;
            __builtin_memcpy(ev->suspect_comm, run->comm, TASK_COMM_LEN);
        }
    }
    /* The suspect's stack is readable only while it is current: when it is
     * the task giving the CPU to the waiter. One that left the CPU earlier
     * (a kernel thread ran in between) gets none. */
    ev->suspect_kernel_bytes = -1;
    ev->suspect_user_bytes = -1;
    if (stack_worthy && prev_tid != 0 && ev->suspect_tid == prev_tid) {
        ev->suspect_kernel_bytes = bpf_get_stack(args, ev->suspect_kernel, sizeof(ev->suspect_kernel), 0);
        ev->suspect_user_bytes = bpf_get_stack(args, ev->suspect_user, sizeof(ev->suspect_user),
                                               BPF_F_USER_STACK);
    }
    int stacked = ev->victim_kernel_bytes > 0 || ev->victim_user_bytes > 0 || ev->suspect_kernel_bytes > 0
        || ev->suspect_user_bytes > 0;
    if (events.ringbuf_output(ev, stacked ? sizeof(*ev) : RUNQ_EVENT_HEAD_SIZE,
                              wakeup_flags(cpu, cfg->wake_us && ev->wait_ns >= cfg->wake_us * 1000ULL)))
        count_drop(DROP_RINGBUF);
    return 0;
}
