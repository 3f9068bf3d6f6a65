// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* irq.h — what the interrupt-time probe keeps (see irq.bpf.c).
 *
 * BCC reads these layouts from the compiled program, so the Python side
 * (collector/probes/irq.py) never restates them.
 */
#ifndef JITTERSCOPE_IRQ_H
#define JITTERSCOPE_IRQ_H

#define NR_SOFTIRQS 10  /* HI .. RCU, include/linux/interrupt.h; stable since 2.6.37 */

/* Cumulative since the probe started: handler runs and the time in them. */
struct irq_sum {
    u64 count;
    u64 time_ns;
};

/* One hard IRQ on one CPU (the `hardirqs` key). Only that CPU updates the
 * entry, and hard IRQ handlers do not nest, so no atomics are needed. */
struct hardirq_key {
    u32 cpu;
    u32 irq;
};

/* Per-CPU timing state (the `state` array): when the running handler
 * started, and the hard IRQ time so far, so a soft IRQ interrupted by hard
 * IRQs is not charged their time twice. */
struct irq_state {
    u64 hard_start;     /* 0: no hard IRQ handler running */
    u64 soft_start;     /* 0: no soft IRQ running */
    u64 hard_total;     /* hard IRQ ns on this CPU since load */
    u64 hard_at_soft;   /* hard_total when the running soft IRQ started */
    u32 hard_irq;
    u32 soft_vec;
};

#endif
