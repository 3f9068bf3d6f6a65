// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* runq.h — the one record the run-queue probe emits, and its tunables.
 *
 * BCC reads this struct's layout from the compiled program, so the Python
 * side never restates it (see collector/probes/runq.py).
 */
#ifndef JITTERSCOPE_RUNQLAT_H
#define JITTERSCOPE_RUNQLAT_H

#include "common.h"  /* TASK_COMM_LEN, UNKNOWN_NODE */

/* Settings written by the collector into the `config` array map. */
struct runq_config {
    u64 threshold_ns;   /* waits at or above this leave the kernel one by one */
    u32 filter_targets; /* 0: every process; 1: only tgids in `targets` */
    u32 has_overrides;  /* some `targets` entries carry their own threshold */
    u32 stacks;         /* capture stacks for waits that leave as events (0: never) */
    u32 wake_us;        /* a wait of this many us or more wakes the reader at once (0: never) */
    u32 stacks_from_us; /* ... of this many us or more (0: every event's) */
    u32 _pad;
};

/* One thread's slot (`threads`): its tgid (0 = not learned yet), when it
 * became runnable (0 = not waiting), and whether its stacks were saved then
 * (in `victim_stacks`, see runq.bpf.c). */
struct thread_state {
    u64 enqueued_ns;
    u32 tgid;
    u32 has_stack;
};

/* How many recent runs per CPU are remembered to name a suspect. */
#define RECENT_RUNS 8

/* One stretch of a task on a CPU. */
struct cpu_run {
    u64 start_ns;
    u64 end_ns;
    u32 pid;            /* tgid */
    u32 tid;
    char comm[TASK_COMM_LEN];
};

/* Per CPU: the task on it since `since_ns`, and the last RECENT_RUNS runs. */
struct cpu_runs {
    u64 since_ns;
    u32 next;           /* ring index of the slot to write next */
    u32 unannounced;    /* events from this CPU since it last woke the reader */
    struct cpu_run runs[RECENT_RUNS];
};

#define STACK_DEPTH 127  /* the kernel's default perf_event_max_stack */

/* A thread's stacks where it was preempted (bpf_get_stack sizes, bytes). */
struct victim_stack {
    u64 started_ns;      /* when that wait began: thread_state.enqueued_ns */
    s64 kernel_bytes;    /* < 0: none */
    s64 user_bytes;
    u64 kernel[STACK_DEPTH];
    u64 user[STACK_DEPTH];
};

/* One run-queue wait at or above the threshold. */
struct runq_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC when the waiter got the CPU */
    u64 wait_ns;        /* runnable -> on CPU */
    u32 pid;            /* tgid of the waiter (0 = not known to the probe) */
    u32 tid;
    u32 cpu;
    u32 suspect_pid;    /* tgid of the task that ran longest on the CPU during the wait */
    u32 suspect_tid;
    u32 waits;          /* 1; more when it sums a serving thread's short waits (struct short_waits) */
    char comm[TASK_COMM_LEN];
    char suspect_comm[TASK_COMM_LEN];
    /* Stacks, innermost first (bytes < 0: none taken): the waiter's where it
     * was preempted (a wakeup has none), the suspect's when it gave the CPU
     * to the waiter (none when it had left the CPU earlier). */
    s64 victim_kernel_bytes;
    s64 victim_user_bytes;
    s64 suspect_kernel_bytes;
    s64 suspect_user_bytes;
    u64 victim_kernel[STACK_DEPTH];
    u64 victim_user[STACK_DEPTH];
    u64 suspect_kernel[STACK_DEPTH];
    u64 suspect_user[STACK_DEPTH];
};
/* An event without stacks is only its head in the ring buffer: ~100 bytes,
 * not ~4 KiB (the reader sees the record's size; the stack sizes, in the
 * head, say none was taken). */
#define RUNQ_EVENT_HEAD_SIZE __builtin_offsetof(struct runq_event, victim_kernel)

/* A serving thread's run-queue waits under its own threshold, summed (see
 * runq.bpf.c): each is too short to send, together they are a request's
 * missing milliseconds (an idle CPU's wake-up after each GIL hand-off). */
struct short_waits {
    u64 last_ns;        /* when the last one ended (0: none held) */
    u64 sum_ns;
    u64 longest_ns;
    u32 count;
    u32 cpu;            /* the longest one's CPU and suspect */
    u32 suspect_pid;
    u32 suspect_tid;
    char suspect_comm[TASK_COMM_LEN];
};

/* Short waits further apart than this are sent as separate sums ... */
#define SHORT_WAIT_GAP_NS 1000000ULL
/* ... when their sum is at least 1/SHORT_WAIT_MIN_PART of the threshold: a
 * thread that wakes every few ms with a few us' latency sends nothing. */
#define SHORT_WAIT_MIN_PART 20

/* Per-process log2 histogram of every wait, in microseconds: slot s holds
 * waits in [2^s, 2^(s+1)) us (floor(log2), as libbpf-tools runqlat). */
struct runq_hist_key {
    u32 pid;
    u32 slot;           /* wait in [2^slot, 2^(slot+1)) us; slot 0 also holds < 1 us */
};

#endif
