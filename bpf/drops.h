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
 * Each program declares the array and its two helpers itself (the block
 * below, copied verbatim): BCC rewrites map calls (drops.lookup) only in the
 * main source file, so they cannot live in this header.
 *
 *   BPF_PERCPU_ARRAY(drops, u64, DROP_SLOTS);
 *   static __always_inline void count_drop(int why) { ... }
 *   static __always_inline void check_update(int ret)  -- counts a failed update
 */
#ifndef JITTERSCOPE_DROPS_H
#define JITTERSCOPE_DROPS_H

#define DROP_RINGBUF 0
#define DROP_MAP_FULL 1

#define DROP_SLOTS 2

#endif
