// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* gpu_ioctl.h — the one record the GPU-ioctl probe emits, and its tunables.
 *
 * BCC reads these layouts from the compiled program, so the Python side
 * never restates them (see collector/probes/gpu_ioctl.py).
 */
#ifndef JITTERSCOPE_GPUIOCTL_H
#define JITTERSCOPE_GPUIOCTL_H

#include "common.h"  /* TASK_COMM_LEN, UNKNOWN_NODE */

/* Settings written by the collector into the `config` array map. */
struct gpu_ioctl_config {
    u64 threshold_ns;   /* calls at or above this leave the kernel one by one; 0 = not configured */
};

/* A (process, file descriptor) pair opened on a GPU device: the `watched` key. */
struct gpu_fd {
    u32 pid;            /* tgid */
    u32 fd;
};

/* An ioctl in flight, per thread, from sys_enter to sys_exit. */
struct ioctl_start {
    u64 ts_ns;
    u64 request;        /* the ioctl command code */
    u32 fd;
    u32 _pad;
};

/* One GPU driver ioctl at or above the threshold. */
struct gpu_ioctl_event {
    u64 ts_ns;          /* CLOCK_MONOTONIC when the call returned */
    u64 latency_ns;     /* sys_enter -> sys_exit */
    u64 request;
    s64 ret;            /* the syscall's return value (negative errno on failure) */
    u32 pid;            /* tgid */
    u32 tid;
    u32 fd;
    u32 _pad;
    char comm[TASK_COMM_LEN];
};

/* Per-process log2 histogram of every watched call, in microseconds
 * (floor(log2): libbpf-tools runqlat's convention; BCC's bpf_log2l is one
 * more, see gpu_ioctl.bpf.c). */
struct gpu_hist_key {
    u32 pid;
    u32 slot;           /* latency in [2^slot, 2^(slot+1)) us; slot 0 also holds < 1 us */
};

#endif
