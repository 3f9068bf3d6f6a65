// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* blocked.h — the record the blocked-thread probe emits, its per-thread
 * state, and its tunables.
 *
 * BCC reads these layouts from the compiled program, so the Python side
 * never restates them (see collector/probes/blocked.py).
 */
#ifndef JITTERSCOPE_BLOCKED_H
#define JITTERSCOPE_BLOCKED_H

#include "common.h"  /* TASK_COMM_LEN, UNKNOWN_NODE */

/* What held a blocked thread: the index into schemas/events.py BLOCKED_KINDS. */
#define BLOCKED_GIL 0       /* in CPython's take_gil: pthread_cond_timedwait on the GIL's cond */
#define BLOCKED_MEMORY 1    /* a page-cache fault waiting for its page, or direct/memcg reclaim */
#define BLOCKED_IO 2        /* any other uninterruptible (D) sleep */
#define BLOCKED_SLEEP 3     /* any other interruptible (S) sleep: futex, poll, network, timers */

/* prev_state bits of sched_switch for a task that went to sleep (a preempted
 * task reports TASK_REPORT_MAX, 0x100 on 4.14+, which has neither). */
#define BLOCKED_STATE_S 0x1
#define BLOCKED_STATE_D 0x2

/* Settings written by the collector into the `config` array map. */
struct blocked_config {
    u64 threshold_ns;   /* blocks at or above this leave the kernel as events; 0 = not configured */
};

/* A watched CPython process's _PyRuntime object: [lo, hi) absolute
 * addresses; a pthread_cond_timedwait on a cond inside it is a GIL wait. */
struct gil_range {
    u64 lo;
    u64 hi;
};

/* A watched thread off the CPU, per tid, from sched_switch to sched_wakeup
 * (its waker noted at sched_waking, where current is the waker, unless a
 * timer's expiry woke it). */
struct blocked_start {
    u64 ts_ns;          /* CLOCK_MONOTONIC when it was switched out */
    u64 waker;          /* pid_tgid of the task current at its sched_waking; 0 until then */
    u32 tgid;
    u32 kind;           /* BLOCKED_* */
    u32 state;          /* BLOCKED_STATE_S or BLOCKED_STATE_D */
    u32 woken;          /* 1 once its sched_waking has passed */
    u32 dev;            /* an io block: the device of the thread's last bio (kernel dev_t), 0 = none seen */
    u32 _pad;
    char comm[TASK_COMM_LEN];
    char waker_comm[TASK_COMM_LEN];
};

/* Per tid: blocks held back to be joined with the next ones into one
 * event: GIL waits of one take_gil so far that ended by their timeout (woken
 * from outside the process), joined with the rest of that take_gil
 * (`gil_pending`); memory or io blocks each under the threshold, close
 * together (`short_runs`: a fault storm is many short sleeps); sleeps that
 * their own timer ended, close together (`short_runs` too: a poll loop). */
struct held_blocks {
    u64 end_ns;         /* when the last of them was woken */
    u64 blocked_ns;     /* their sum */
    u64 start_ns;       /* a sleep run: when its first sleep began */
    u32 tgid;
    u32 waker_pid;      /* the last waker */
    u32 waker_tid;
    u32 kind;           /* of them all */
    u32 dev;            /* io: the device of the last one's bio (kernel dev_t), 0 = none seen */
    u32 _pad;
    char comm[TASK_COMM_LEN];
    char waker_comm[TASK_COMM_LEN];
};

/* One block at or above the threshold. */
struct blocked_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC when it was woken: queued to run (a reclaim: when it ended) */
    u64 blocked_ns;     /* switch-out -> wakeup (a reclaim: begin -> end, on-CPU time included) */
    u32 pid;            /* tgid of the blocked thread */
    u32 tid;
    u32 waker_pid;      /* tgid of the task current at sched_waking: 0 = no task woke it: an interrupt on
                         * an idle CPU, or a timer (then waker_tid is the thread's own tid) */
    u32 waker_tid;
    u32 kind;           /* BLOCKED_* */
    u32 state;          /* BLOCKED_STATE_S / _D; 0 for a whole-reclaim record */
    u32 dev;            /* io: the device (kernel dev_t: major << 20 | minor) of the last bio the
                         * thread queued before it slept; 0 = none seen (other kinds: 0) */
    u32 _pad;
    char comm[TASK_COMM_LEN];
    char waker_comm[TASK_COMM_LEN];
};

#endif
