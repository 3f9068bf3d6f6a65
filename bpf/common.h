// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* common.h — definitions every program shares, included by each probe's .h.
 *
 * Plain #defines and struct definitions only. What touches a map cannot live
 * in a header: BCC rewrites map method calls (`drops.lookup(&k)`,
 * `events.ringbuf_reserve(...)`) and BPF_TABLE declarations only in the text
 * handed to BPF(text=...), never in files pulled in with #include, so such
 * code in a header fails to compile. That code is in drops.bpf.inc, which the
 * loader splices into the main text (collector/probes/base.py,
 * spliced_source).
 *
 * The Python side mirrors these two values in collector/probes/base.py
 * (tests/unit/collector/probes/test_probe_decoding.py checks they agree).
 */
#ifndef JITTERSCOPE_COMMON_H
#define JITTERSCOPE_COMMON_H

#define TASK_COMM_LEN 16    /* a kernel task name, NUL included */
#define UNKNOWN_NODE 255    /* a page or CPU outside every range / map the collector gave */

#endif
