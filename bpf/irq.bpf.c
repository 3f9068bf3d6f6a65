// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* irq.bpf.c — time each CPU spends in hard and soft interrupt handlers.
 *
 * Reads only tracepoint arguments (irq number, softirq vector) and
 * bpf_ktime_get_ns(). Raw tracepoints, for two reasons: a perf-event
 * tracepoint program is skipped whenever any other such BPF program is
 * running on the CPU (one global recursion guard), and an interrupt often
 * lands in the middle of the run-queue probe's sched_switch program -- its
 * handlers would go uncounted (measured: a few per 100 on a busy host).
 * A raw tracepoint program guards only against itself. Its arguments are
 * the tracepoint's prototype: irq_handler_entry(int irq, struct irqaction *),
 * irq_handler_exit(int irq, struct irqaction *, int ret),
 * softirq_entry/exit(unsigned int vec); no struct is read. Nothing leaves the kernel one by one: handler runs and
 * their time are summed per (CPU, IRQ) and per (CPU, softirq vector), and the
 * collector reads the cumulative sums as deltas (collector/probes/irq.py).
 *
 * Cost: one per-CPU array look-up at entry, one more plus one small hash
 * look-up at exit -- on the irq: tracepoints only, never in the scheduler
 * probe's path. Soft IRQ time excludes the hard IRQs that interrupted it
 * (the kernel's own irqtime accounting does the same). Handlers that were
 * already running when the probe attached are not counted (no start time).
 * A shared IRQ line runs one handler per device (irq_handler_entry/exit
 * fire per handler), so its count can exceed /proc/interrupts' count.
 */
#include "irq.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

#ifndef MAX_HARDIRQ_KEYS  /* -DMAX_HARDIRQ_KEYS=... shrinks it (tests) */
#define MAX_HARDIRQ_KEYS 8192
#endif

BPF_PERCPU_ARRAY(state, struct irq_state, 1);
BPF_PERCPU_ARRAY(softirqs, struct irq_sum, NR_SOFTIRQS);
BPF_HASH(hardirqs, struct hardirq_key, struct irq_sum, MAX_HARDIRQ_KEYS);

static __always_inline struct irq_state *cpu_state(void)
{
    int zero = 0;
    return state.lookup(&zero);
}

RAW_TRACEPOINT_PROBE(irq_handler_entry)
{
    struct irq_state *s = cpu_state();
    if (s) {
        s->hard_start = bpf_ktime_get_ns();
        s->hard_irq = (u32)ctx->args[0];
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(irq_handler_exit)
{
    u32 irq = (u32)ctx->args[0];
    struct irq_state *s = cpu_state();
    if (!s || !s->hard_start || s->hard_irq != irq)
        return 0;
    u64 delta = bpf_ktime_get_ns() - s->hard_start;
    s->hard_start = 0;
    s->hard_total += delta;
    struct hardirq_key key = {.cpu = bpf_get_smp_processor_id(), .irq = irq};
    struct irq_sum *sum = hardirqs.lookup(&key);
    if (!sum) {
        struct irq_sum fresh = {};
        if (hardirqs.insert(&key, &fresh) < 0) {  /* only this CPU inserts this key */
            count_drop(DROP_MAP_FULL);
            return 0;
        }
        sum = hardirqs.lookup(&key);
        if (!sum)
            return 0;
    }
    sum->count++;
    sum->time_ns += delta;
    return 0;
}

RAW_TRACEPOINT_PROBE(softirq_entry)
{
    struct irq_state *s = cpu_state();
    if (s) {
        s->soft_start = bpf_ktime_get_ns();
        s->soft_vec = (u32)ctx->args[0];
        s->hard_at_soft = s->hard_total;
    }
    return 0;
}

RAW_TRACEPOINT_PROBE(softirq_exit)
{
    struct irq_state *s = cpu_state();
    u32 vec = (u32)ctx->args[0];
    if (!s || !s->soft_start || s->soft_vec != vec || vec >= NR_SOFTIRQS)
        return 0;
    u64 delta = bpf_ktime_get_ns() - s->soft_start;
    u64 nested = s->hard_total - s->hard_at_soft;
    s->soft_start = 0;
    int idx = vec;
    struct irq_sum *sum = softirqs.lookup(&idx);
    if (sum) {  /* per-CPU: this CPU's slot only */
        sum->count++;
        sum->time_ns += delta > nested ? delta - nested : 0;
    }
    return 0;
}
