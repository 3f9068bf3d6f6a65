// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* blocked.bpf.c — why a serving thread was off the CPU without being
 * preempted: every block (switched out asleep, S or D) of a thread of a
 * watched process that lasts at least config.threshold_ns, with what it was
 * blocked on and the task that woke it.
 *
 * Reads only tracepoint arguments, uprobe registers and BPF helpers, never
 * kernel structs: BCC takes tracepoint layouts from tracefs at run time.
 *
 * A block starts at sched:sched_switch, where current is the sleeper
 * (prev_state S or D; a preempted task reports 0x100, a task woken before it
 * got to switch reports 0: neither is a block) and ends at sched:sched_wakeup,
 * when the woken task is queued to run, where the run-queue probe's wait
 * begins (bpf/runq.bpf.c). Its waker is noted at sched:sched_waking, which
 * runs in the waker's context (sched_wakeup may run later on the sleeper's
 * CPU, from the wake-list IPI, where current is whoever ran there). The time
 * between the two (the IPI; on a VM, the idle vCPU's return from the
 * hypervisor: 46 ms in 817 wakes of a server beside a GIL hog here, up to
 * 2.5 ms one) is part of the block.
 * Its kind, decided at the switch-out, first match wins:
 *   gil     the thread is inside pthread_cond_timedwait on a cond inside the
 *           process's _PyRuntime object (CPython's take_gil waits for the
 *           GIL there): a per-process uprobe/uretprobe pair on libc marks it
 *           (`in_gil`). take_gil waits 5 ms (the switch interval) at a
 *           time: a wait that times out is woken by the timer (the idle task
 *           or whoever ran where it fired), asks the holder to drop the GIL
 *           and waits again until the holder signals it. The waits of one
 *           take_gil are one event (blocked_ns their sum, ts the last wake;
 *           the on-CPU moments between them are not counted, so ts -
 *           blocked_ns is later than the first wait began), named after the
 *           thread that dropped the GIL; one that only timed out is sent
 *           alone at the thread's next sleep or GIL wait (`gil_pending`).
 *   memory  the thread is in direct or memcg reclaim (vmscan: begin/end), or
 *           it sleeps in D within FAULT_WINDOW_NS of a filemap fault
 *           (filemap:mm_filemap_fault: fault-around could not map the page —
 *           not in the page cache or not uptodate yet, the major-fault
 *           path). A memory block that ends re-arms the window (one fault
 *           can sleep several times: readahead I/O, then the folio lock),
 *           and so does each page the thread inserts into the page cache
 *           inside the window (filemap:mm_filemap_add_to_page_cache: a big
 *           readahead allocates for milliseconds before it sleeps).
 *           A reclaim counts whole, on-CPU part included (state 0, waker =
 *           the thread itself): the sleeps inside it are not counted again.
 *   io      any other D sleep (block I/O, O_DIRECT, fsync, NFS, ...), with
 *           the device of the last bio the thread queued (block:
 *           block_bio_queue, in its context) since it last slept in S.
 *           Memory and io stalls (blocks, reclaims) under the threshold
 *           that follow each other within RUN_GAP_NS (1 ms) are one run,
 *           sent as one event when their sum reaches it (`short_runs`):
 *           evicted weights come back as thousands of 0.1-0.5 ms fault
 *           sleeps and reclaims, none of them an event alone. The run's
 *           event is placed at its last wake (ts - blocked_ns is then later
 *           than its first stall began).
 *   sleep   any other S sleep (futex, poll/epoll, network, timers). A sleep
 *           clears the fault window (the thread went back to user space).
 *           Sleeps that their own timer ended (below), each under
 *           SLEEP_ALONE_NS and begun within RUN_GAP_NS of the thread's last
 *           timer wake, are one run (`short_runs`, kind sleep) spanning at
 *           most SLEEP_RUN_SPAN_NS, sent as one event when it ends: a real
 *           vLLM's gloo threads poll every 10 ms, a third of the 3,700
 *           sleeps a second its threads made on 2 CPUs, and the collector
 *           spent ~12 us of Python on each. The run is placed at its last
 *           wake (ts - blocked_ns is later than its first sleep began, by
 *           the moments on the CPU between them). Every other sleep is an
 *           event of its own: who woke it is a wait-for edge.
 * A wake from a timer's expiry (between timer:hrtimer_expire_entry and
 * _exit on that CPU: poll, futex and nanosleep timeouts, timerfd) names no
 * waker: waker_pid 0 and the thread's own tid, whatever task the timer
 * interrupted (on a busy host, some serving thread: a false wait-for edge).
 *
 * What it cannot see or gets wrong:
 *  - a D sleep within 2 ms of a page-cache fault (or of a page inserted
 *    after one) counts as memory even when it is unrelated I/O, e.g. a
 *    read() just after a fault; a fault that spends over 2 ms on the CPU
 *    without inserting a page before it sleeps is io. Kernels without
 *    filemap:mm_filemap_fault file all fault sleeps as io.
 *  - a GIL wait that spins or returns without sleeping is not seen; a
 *    thread blocked on the GIL's mutex (not its cond) is sleep; CPython
 *    builds without _PyRuntime symbols, free-threaded builds and
 *    sub-interpreters' own GILs are not measured (collector/pyruntime.py).
 *  - futex, poll and network waits are all sleep: nothing tells a lock
 *    from a socket.
 *  - the waker of a wake from an interrupt other than a timer's is the task
 *    the interrupt found on that CPU (pid 0 when the CPU was idle): for io,
 *    the device says more. A soft hrtimer's callback interrupted by a hard
 *    one loses its timer mark for the rest of that callback.
 *  - a sleep run's event is sent when the thread's next block ends (or at
 *    its next block, when that comes over RUN_GAP_NS later): a thread that
 *    polls and then blocks for seconds without a timeout sends its last
 *    run that late (one that exits sends it then).
 *  - a wake that races the sleeper's own switch-out (the waker on another
 *    CPU fires sched_waking while the sleeper is between reading its state
 *    and the sched_switch tracepoint) is not a block: its record, made after
 *    that waking, is removed unsent at sched:sched_wakeup, which always
 *    follows that switch-out (~5% of the wakes of a futex ping-pong on 2
 *    CPUs: left, the next wake before a real sleep would report a long one),
 *    unless it reached the threshold by then (a VM's slow wake-up IPI).
 *  - a sched_waking the kernel's recursion guard skipped (an interrupt's
 *    wake while a BPF program ran on that CPU) names no waker.
 *
 * Cost: the program runs on every context switch and wakeup on the host.
 * A switch of a task that is preempted costs a bit test; one that sleeps,
 * one hash look-up (`watched`, by tgid). A wakeup costs one LRU-hash look-up
 * in sched_waking and one in sched_wakeup (a miss for unwatched tasks).
 * Page-cache faults, reclaims and bios cost one `watched` look-up each, a
 * page inserted into the page cache one `fault_at` look-up, a timer's
 * expiry two per-CPU array look-ups (entry and exit), a thread's exit two
 * look-ups (`short_runs`, `gil_pending`). Only watched
 * threads pay more: up to four look-ups and one insert per block, and the
 * uprobe trap (~1-2 us) on each pthread_cond_timedwait call and return in
 * a measured CPython process.
 */
#include <uapi/linux/ptrace.h>  /* struct pt_regs: the uprobes' context (a uapi type) */
#include "blocked.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

#define FAULT_WINDOW_NS 2000000ULL  /* a D sleep this soon after a filemap fault is the fault's */
#define FAULT_CPU_GAP_NS 100000ULL  /* fault-storm marks this close: on the CPU handling faults */
#define GIL_CONTINUE_NS 1000000ULL  /* a GIL wait this soon after one woken by its timeout continues it */
#define RUN_GAP_NS 1000000ULL  /* memory or io blocks under the threshold, or sleeps, this close together are one run */
#define SLEEP_ALONE_NS 20000000ULL  /* a timer sleep this long is an event of its own */
#define SLEEP_RUN_SPAN_NS 100000000ULL  /* a sleep run spans at most this, first start to last wake */
#define TIMER_CALLBACK_NS 1000000ULL  /* a timer mark older than this is stale (its exit was missed: attached after) */

#ifndef MAX_WATCHED  /* -DMAX_WATCHED=... shrinks it (tests) */
#define MAX_WATCHED 4096
#endif
#ifndef MAX_THREADS  /* per-thread state, LRU: never "full" */
#define MAX_THREADS 16384
#endif

BPF_ARRAY(config, struct blocked_config, 1);
BPF_HASH(watched, u32, u8, MAX_WATCHED);                 /* tgid -> 1: the serving groups */
BPF_HASH(gil, u32, struct gil_range, MAX_WATCHED);       /* tgid -> its _PyRuntime range */
/* tid -> since when, each LRU: a thread killed inside leaves its entry */
BPF_TABLE("lru_hash", u32, u64, in_gil, MAX_THREADS);
BPF_TABLE("lru_hash", u32, u64, in_reclaim, MAX_THREADS);
BPF_TABLE("lru_hash", u32, u64, fault_at, MAX_THREADS);
BPF_TABLE("lru_hash", u32, u32, io_dev, MAX_THREADS);  /* tid -> the device of its last bio, until it sleeps in S */
BPF_TABLE("lru_hash", u32, struct blocked_start, blocked_at, MAX_THREADS);
BPF_TABLE("lru_hash", u32, struct held_blocks, gil_pending, MAX_THREADS);
BPF_TABLE("lru_hash", u32, struct held_blocks, short_runs, MAX_THREADS);
BPF_TABLE("lru_hash", u32, u64, timer_woke, MAX_THREADS);  /* tid -> when its own timer last woke it */
/* per CPU: when the timer callback running there began (0: none); a
 * timestamp, not a flag, so that an exit missed (attached in between) goes stale */
BPF_PERCPU_ARRAY(in_timer, u64, 1);
/* 2048 pages = 8 MiB: ~104,000 events of 80 bytes between two reads. A
 * real vLLM on the CPU sends ~600 a second on its own (its gloo_tcp_loop
 * threads poll every 10 ms), and a collector starved of CPU on a busy
 * 2-CPU host has gone seconds without reading: 1 MiB lost 30,000 of them. */
BPF_RINGBUF_OUTPUT(events, 2048);

static __always_inline u64 threshold_ns(void)
{
    int zero = 0;
    struct blocked_config *cfg = config.lookup(&zero);
    return cfg ? cfg->threshold_ns : 0;
}

/* The reader polls (collector/agent.py, every 50 ms at most): a wakeup per
 * event would cost it a syscall and a context switch each. */
static __always_inline void emit_from(u64 now, u64 blocked_ns, u32 pid, u32 tid, u32 kind, u32 state,
                                      const char *comm, u64 waker, const char *waker_comm, u32 dev)
{
    struct blocked_event *ev = events.ringbuf_reserve(sizeof(*ev));
    if (!ev) {
        count_drop(DROP_RINGBUF);
        return;
    }
    ev->ts_ns = now;
    ev->blocked_ns = blocked_ns;
    ev->pid = pid;
    ev->tid = tid;
    ev->waker_pid = waker >> 32;
    ev->waker_tid = (u32)waker;
    ev->kind = kind;
    ev->state = state;
    ev->dev = dev;
    ev->_pad = 0;
    bpf_probe_read_kernel(&ev->comm, sizeof(ev->comm), comm);
    if (waker_comm)
        bpf_probe_read_kernel(&ev->waker_comm, sizeof(ev->waker_comm), waker_comm);
    else
        bpf_get_current_comm(&ev->waker_comm, sizeof(ev->waker_comm));
    events.ringbuf_submit(ev, BPF_RB_NO_WAKEUP);
}


#include "blocked_runs.bpf.inc"  /* spliced in by the loader: the held blocks and their runs */

/* A thread that exits sends what it held (its last sleep or fault run, a
 * timed-out GIL wait): no next block of its would. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct held_blocks *run = short_runs.lookup(&tid);
    if (run)
        flush_run(tid, run);
    struct held_blocks *p = gil_pending.lookup(&tid);
    if (p)
        flush_gil(tid, p);
    return 0;
}

/* A timer's callback runs between these two on its CPU (hrtimer_wakeup of
 * a poll, futex or nanosleep timeout among them): what it wakes, no task woke. */
TRACEPOINT_PROBE(timer, hrtimer_expire_entry)
{
    int zero = 0;
    u64 *began = in_timer.lookup(&zero);
    if (began)
        *began = bpf_ktime_get_ns();
    return 0;
}

TRACEPOINT_PROBE(timer, hrtimer_expire_exit)
{
    int zero = 0;
    u64 *began = in_timer.lookup(&zero);
    if (began)
        *began = 0;
    return 0;
}

static __always_inline int woken_by_timer(void)
{
    int zero = 0;
    u64 *began = in_timer.lookup(&zero);
    return began && *began && bpf_ktime_get_ns() - *began < TIMER_CALLBACK_NS;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    long state = args->prev_state;
    if (!(state & (BLOCKED_STATE_S | BLOCKED_STATE_D)))  /* preempted, or not asleep */
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();  /* current is still prev here */
    u32 tgid = pid_tgid >> 32;
    if (!watched.lookup(&tgid))
        return 0;
    u32 tid = (u32)pid_tgid;
    u64 now = bpf_ktime_get_ns();
    u32 kind;
    if (in_gil.lookup(&tid)) {
        kind = BLOCKED_GIL;
    } else if (in_reclaim.lookup(&tid)) {
        kind = BLOCKED_MEMORY;
    } else {
        u64 *fault = fault_at.lookup(&tid);
        if (state & BLOCKED_STATE_D) {
            kind = fault && now - *fault < FAULT_WINDOW_NS ? BLOCKED_MEMORY : BLOCKED_IO;
        } else {
            kind = BLOCKED_SLEEP;
            if (fault)  /* back in user space and asleep on something else */
                fault_at.delete(&tid);
            io_dev.delete(&tid);  /* its last bio was for another call */
        }
    }
    if (kind != BLOCKED_GIL) {  /* a GIL wait that ended by its timeout is over */
        struct held_blocks *p = gil_pending.lookup(&tid);
        if (p)
            flush_gil(tid, p);
    }
    struct held_blocks *run = short_runs.lookup(&tid);
    if (run && (run->kind != kind || now - run->end_ns > RUN_GAP_NS))  /* no more of that run */
        flush_run(tid, run);
    struct blocked_start b = {
        .ts_ns = now, .tgid = tgid, .kind = kind,
        .state = state & BLOCKED_STATE_D ? BLOCKED_STATE_D : BLOCKED_STATE_S, .waker = 0, .woken = 0,
        .dev = 0, ._pad = 0,
    };
    if (kind == BLOCKED_IO) {
        u32 *dev = io_dev.lookup(&tid);
        if (dev)
            b.dev = *dev;
    }
    bpf_get_current_comm(&b.comm, sizeof(b.comm));
    check_update(blocked_at.update(&tid, &b));
    return 0;
}

/* The waker: current, in its own context (or a timer, see the top). The
 * block goes on until the thread is queued to run (sched_wakeup). */
TRACEPOINT_PROBE(sched, sched_waking)
{
    u32 tid = args->pid;
    struct blocked_start *b = blocked_at.lookup(&tid);
    if (!b || b->woken)
        return 0;
    if (woken_by_timer()) {  /* no one: its own timeout (waker_pid 0, its own tid) */
        b->waker = tid;
        __builtin_memcpy(&b->waker_comm, &b->comm, sizeof(b->waker_comm));
    } else {
        b->waker = bpf_get_current_pid_tgid();
        bpf_get_current_comm(&b->waker_comm, sizeof(b->waker_comm));
    }
    b->woken = 1;
    return 0;
}

/* The block is over: the thread is queued to run. A short record not yet
 * woken was made after its sched_waking had already passed (try_to_wake_up
 * waits for the task to leave its CPU, or queues the wakeup on that CPU,
 * so this always follows the switch-out): not a block (see the top). A long
 * one lost its sched_waking to the kernel's recursion guard (an interrupt's
 * wake while a BPF program ran there): a block, no waker known (pid, tid 0). */
TRACEPOINT_PROBE(sched, sched_wakeup)
{
    u32 tid = args->pid;
    struct blocked_start *b = blocked_at.lookup(&tid);
    if (!b)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct blocked_start copy = {};
    __builtin_memcpy(&copy, b, sizeof(copy));
    blocked_at.delete(&tid);
    u64 blocked_ns = now > copy.ts_ns ? now - copy.ts_ns : 0;
    if (!copy.woken && blocked_ns < threshold_ns())
        return 0;
    if (copy.kind == BLOCKED_MEMORY)  /* the same fault may sleep again */
        check_update(fault_at.update(&tid, &now));
    if (copy.kind == BLOCKED_GIL) {
        /* one take_gil's waits (5 ms each, see the top) are one event, named
         * after the thread that dropped the GIL: a wake from outside the
         * process (its timeout) is held in gil_pending, added to the next. */
        struct held_blocks *p = gil_pending.lookup(&tid);
        if (p) {
            hold_more(p, now, blocked_ns, copy.waker, copy.waker_comm);
            blocked_ns = p->blocked_ns;  /* the whole take_gil so far */
        }
        if ((copy.waker >> 32) != copy.tgid) {
            if (!p) {
                struct held_blocks fresh = {};
                hold_first(&fresh, now, blocked_ns, copy.tgid, BLOCKED_GIL, copy.comm, copy.waker,
                           copy.waker_comm);
                check_update(gil_pending.update(&tid, &fresh));
            }
            return 0;
        }
        if (p)
            gil_pending.delete(&tid);
    }
    u64 threshold = threshold_ns();
    if (threshold == 0)
        return 0;
    if (copy.kind == BLOCKED_MEMORY || copy.kind == BLOCKED_IO) {
        if (copy.kind == BLOCKED_MEMORY && in_reclaim.lookup(&tid))
            return 0;  /* a sleep inside a reclaim: the reclaim's own event covers it */
        add_stall(tid, copy.tgid, copy.kind, copy.state, copy.ts_ns, now, blocked_ns, copy.comm, threshold,
                  copy.waker, copy.waker_comm, copy.dev);
        return 0;
    }
    if (blocked_ns < threshold)
        return 0;
    if (copy.kind == BLOCKED_SLEEP) {
        add_sleep(tid, &copy, now, blocked_ns);
        return 0;
    }
    emit_from(now, blocked_ns, copy.tgid, tid, copy.kind, copy.state, copy.comm, copy.waker, copy.waker_comm, 0);
    return 0;
}

#ifdef HAVE_FILEMAP_FAULT  /* the loader defines it where tracefs has mm_filemap_fault (recent kernels) */
/* Between two marks of one fault storm (a fault, a page inserted, a
 * reclaim's end, a memory sleep's wake) less than FAULT_CPU_GAP_NS apart,
 * the thread was on the CPU handling faults (allocating, charging, mapping,
 * submitting readahead), not running its own code: memory time too. */
static __always_inline void fault_mark(u64 *fault, u64 now)
{
    u64 prev = *fault;
    *fault = now;
    if (now <= prev || now - prev >= FAULT_CPU_GAP_NS)
        return;
    u64 threshold = threshold_ns();
    if (threshold == 0)
        return;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    char comm[TASK_COMM_LEN];
    bpf_get_current_comm(&comm, sizeof(comm));
    add_stall((u32)pid_tgid, pid_tgid >> 32, BLOCKED_MEMORY, 0, prev, now, now - prev, comm, threshold,
              pid_tgid, 0, 0);
}

TRACEPOINT_PROBE(filemap, mm_filemap_fault)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if (!watched.lookup(&tgid))
        return 0;
    u32 tid = (u32)pid_tgid;
    u64 now = bpf_ktime_get_ns();
    u64 *fault = fault_at.lookup(&tid);
    if (fault)
        fault_mark(fault, now);
    else
        check_update(fault_at.update(&tid, &now));
    return 0;
}

/* A fault's readahead can spend milliseconds on the CPU allocating and
 * inserting its pages (read_ahead_kb is 8 MiB on some disks) before it
 * sleeps on the I/O: each page it inserts keeps its window open. Stores in
 * place, never inserts: only a thread inside a window has an entry. */
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 *fault = fault_at.lookup(&tid);
    if (!fault)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (now - *fault < FAULT_WINDOW_NS)
        fault_mark(fault, now);
    return 0;
}
#endif

/* A bio a watched thread queued (submit_bio, in its context): the device
 * its next io sleep waits on (a loop device's own I/O below is its kworker's). */
TRACEPOINT_PROBE(block, block_bio_queue)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if (!watched.lookup(&tgid))
        return 0;
    u32 tid = (u32)pid_tgid;
    u32 dev = args->dev;
    check_update(io_dev.update(&tid, &dev));
    return 0;
}

static __always_inline int reclaim_begin(void)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if (!watched.lookup(&tgid))
        return 0;
    u32 tid = (u32)pid_tgid;
    u64 now = bpf_ktime_get_ns();
    check_update(in_reclaim.update(&tid, &now));
    return 0;
}

static __always_inline int reclaim_end(void)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tid = (u32)pid_tgid;
    u64 *began = in_reclaim.lookup(&tid);
    if (!began)
        return 0;
    u64 start = *began;
    in_reclaim.delete(&tid);
    u64 now = bpf_ktime_get_ns();
    u64 threshold = threshold_ns();
    if (threshold == 0 || now < start)
        return 0;
    char comm[TASK_COMM_LEN];
    bpf_get_current_comm(&comm, sizeof(comm));
    add_stall(tid, pid_tgid >> 32, BLOCKED_MEMORY, 0, start, now, now - start, comm, threshold, pid_tgid, 0, 0);
    u64 *fault = fault_at.lookup(&tid);
    if (fault)  /* the storm's next mark counts from here: the reclaim is counted */
        *fault = now;
    return 0;
}

TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_begin) { return reclaim_begin(); }
TRACEPOINT_PROBE(vmscan, mm_vmscan_direct_reclaim_end) { return reclaim_end(); }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_begin) { return reclaim_begin(); }
TRACEPOINT_PROBE(vmscan, mm_vmscan_memcg_reclaim_end) { return reclaim_end(); }

/* uprobe on libc's pthread_cond_timedwait(cond, mutex, abstime), attached
 * per process (collector/probes/blocked.py, watch_gil): a wait on a cond
 * inside _PyRuntime is take_gil's. */
int gil_wait_enter(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    struct gil_range *range = gil.lookup(&tgid);
    if (!range)
        return 0;
    u64 cond = PT_REGS_PARM1(ctx);
    if (cond < range->lo || cond >= range->hi)
        return 0;
    u32 tid = (u32)pid_tgid;
    u64 now = bpf_ktime_get_ns();
    /* a timed-out wait not followed at once by the next is a take_gil of its own */
    struct held_blocks *p = gil_pending.lookup(&tid);
    if (p && now - p->end_ns > GIL_CONTINUE_NS)
        flush_gil(tid, p);
    check_update(in_gil.update(&tid, &now));
    return 0;
}

/* ... and its uretprobe: every return, GIL cond or not. */
int gil_wait_return(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    if (in_gil.lookup(&tid))
        in_gil.delete(&tid);
    return 0;
}
