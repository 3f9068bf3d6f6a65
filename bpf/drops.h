// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* drops.h — the loss counters every program keeps: one per-CPU array (no
 * atomics, no contention) the collector sums (collector/probes/base.py,
 * BccProbe.drops and .map_full_drops).
 *
 *   [DROP_RINGBUF]   events lost: the ring buffer was full (reserve failed)
 *   [DROP_MAP_FULL]  state lost: an in-kernel map update failed -- in
 *                    practice a bounded hash map that is full (E2BIG); an
 *                    LRU map evicts instead, and fails only when every entry
 *                    is busy. Map sizes are compile-time MAX_* macros, each
 *                    overridable with -D (BccProbe.defines).
 *
 * The array and its two helpers (count_drop, check_update) are in
 * drops.bpf.inc, which the loader splices into each program's text: BCC
 * rewrites map calls (drops.lookup) only in the main source file.
 */
#ifndef JITTERSCOPE_DROPS_H
#define JITTERSCOPE_DROPS_H

#define DROP_RINGBUF 0
#define DROP_MAP_FULL 1

#define DROP_SLOTS 2

#endif
