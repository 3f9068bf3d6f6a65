// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* gpu_ioctl.bpf.c — latency of GPU driver ioctls, by the portable path.
 *
 * syscalls:sys_enter_ioctl / sys_exit_ioctl exist on every kernel with
 * tracepoints (the NVIDIA driver's own functions need kprobes, which some
 * kernels lack). Only calls on (tgid, fd) pairs in `watched` are timed: the
 * collector finds the fds that processes hold open on GPU device files
 * (/dev/nvidiaN, /dev/nvidia-uvm) and writes them there, so every other
 * ioctl on the host costs one hash look-up at entry and one at exit. An
 * attached syscall tracepoint also sends every syscall of every process
 * down the kernel's traced path, whatever it is: the loader attaches these
 * only while some fd is watched (collector/probes/gpu_ioctl.py).
 *
 * Reads only tracepoint arguments and BPF helpers, never kernel structs.
 * Every watched call goes into a per-process log2 histogram; calls at or
 * above config.threshold_ns also leave as one ring-buffer event each.
 */
#include "gpu_ioctl.h"
#include "drops.bpf.inc"  /* spliced in by the loader, see drops.h */

#ifndef MAX_WATCHED  /* -DMAX_WATCHED=... shrinks it (tests) */
#define MAX_WATCHED 16384
#endif
#ifndef MAX_IN_FLIGHT  /* -DMAX_IN_FLIGHT=... shrinks it (tests) */
#define MAX_IN_FLIGHT 16384
#endif
#ifndef MAX_HIST_KEYS  /* -DMAX_HIST_KEYS=... shrinks it (tests) */
#define MAX_HIST_KEYS 16384
#endif

BPF_HASH(watched, struct gpu_fd, u8, MAX_WATCHED);
/* tid -> the call it is in. LRU: a thread killed in the middle of a call
 * still passes sys_exit, but nothing here may grow without bound. */
BPF_TABLE("lru_hash", u32, struct ioctl_start, in_flight, MAX_IN_FLIGHT);
BPF_ARRAY(config, struct gpu_ioctl_config, 1);
BPF_HASH(hist, struct gpu_hist_key, u64, MAX_HIST_KEYS);
BPF_RINGBUF_OUTPUT(events, 16);                     /* 16 pages = 64 KiB */

TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    struct gpu_fd key = {.pid = pid_tgid >> 32, .fd = (u32)args->fd};
    if (!watched.lookup(&key))
        return 0;
    u32 tid = (u32)pid_tgid;
    struct ioctl_start start = {
        .ts_ns = bpf_ktime_get_ns(), .request = (u32)args->cmd, .fd = key.fd, ._pad = 0,
    };
    check_update(in_flight.update(&tid, &start));
    return 0;
}

/* A closed fd stops being a GPU fd at once: its number may be reused before
 * the collector's next rescan, and those calls are not GPU calls. One hash
 * delete per close(). (dup2/dup3 onto a watched number are not followed.) */
TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    struct gpu_fd key = {.pid = bpf_get_current_pid_tgid() >> 32, .fd = (u32)args->fd};
    watched.delete(&key);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_ioctl)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tid = (u32)pid_tgid;
    struct ioctl_start *start = in_flight.lookup(&tid);
    if (!start)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 latency_ns = now - start->ts_ns;
    u64 request = start->request;
    u32 fd = start->fd;
    in_flight.delete(&tid);

    int zero = 0;
    struct gpu_ioctl_config *cfg = config.lookup(&zero);
    if (!cfg || cfg->threshold_ns == 0)  /* not configured yet, or being torn down */
        return 0;

    u32 tgid = pid_tgid >> 32;
    /* BCC's bpf_log2l(v) is floor(log2(v)) + 1 for v >= 1 (0 for 0): one
     * less is the bucket [2^slot, 2^(slot+1)) us that gpu_ioctl.h and the
     * LatencyHistogram record promise (< 1 us in slot 0 too). */
    u64 us = latency_ns / 1000;
    struct gpu_hist_key hkey = {.pid = tgid, .slot = us ? bpf_log2l(us) - 1 : 0};
    u64 none = 0;
    u64 *count = hist.lookup_or_try_init(&hkey, &none);
    if (count)
        __sync_fetch_and_add(count, 1);
    else
        count_drop(DROP_MAP_FULL);

    if (latency_ns < cfg->threshold_ns)
        return 0;
    struct gpu_ioctl_event *ev = events.ringbuf_reserve(sizeof(*ev));
    if (!ev) {
        count_drop(DROP_RINGBUF);
        return 0;
    }
    ev->ts_ns = now;
    ev->latency_ns = latency_ns;
    ev->request = request;
    ev->ret = args->ret;
    ev->pid = tgid;
    ev->tid = tid;
    ev->fd = fd;
    ev->_pad = 0;
    bpf_get_current_comm(&ev->comm, sizeof(ev->comm));
    events.ringbuf_submit(ev, 0);
    return 0;
}
