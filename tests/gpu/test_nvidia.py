# SPDX-License-Identifier: Apache-2.0
"""The NVIDIA paths on a real GPU host: NVML topology and GPU driver ioctl
latency under a real CUDA workload. This machine class has no GPU; on a host
without /dev/nvidia0 and libcuda these tests skip and say why. Run on a GPU
host with: make test ARGS="tests/gpu -s"."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from pathlib import Path

import pytest

from jitterscope.collector.probes.gpu_ioctl import GpuIoctlProbe, gpu_fds
from jitterscope.collector.topology import process_gpus, read_topology
from jitterscope.schemas.events import Topology

HAS_GPU = Path("/dev/nvidia0").exists() and ctypes.util.find_library("cuda") is not None
pytestmark = [pytest.mark.bpf, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (/dev/nvidia0 and libcuda)")]


def cuda_workload(seconds: float) -> None:
    """Allocate, copy and synchronise through the CUDA driver API: each step
    is a driver ioctl."""
    cuda = ctypes.CDLL(ctypes.util.find_library("cuda"))
    check = lambda rc: rc == 0 or pytest.fail(f"CUDA driver call failed: {rc}")  # noqa: E731
    check(cuda.cuInit(0))
    device, context, buffer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0))
    check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    host = ctypes.create_string_buffer(64 << 20)
    check(cuda.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(64 << 20)))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check(cuda.cuMemcpyHtoD_v2(buffer, host, ctypes.c_size_t(64 << 20)))
        check(cuda.cuCtxSynchronize())
    cuda.cuMemFree_v2(buffer)
    cuda.cuCtxDestroy_v2(context)


def test_nvml_topology_names_every_gpu():
    topo = Topology(host="h", boot_id="b", seq=0, ts_ns=0, **read_topology())
    gpus = [d for d in topo.pci if d.kind == "gpu"]
    assert gpus and all(d.name for d in gpus), gpus
    assert all(d.numa_node >= -1 and d.link_width > 0 for d in gpus)
    print(f"\n[gpu] {len(gpus)} GPU(s): " + ", ".join(f"{d.address} node {d.numa_node} gen{d.link_gen} "
                                                    f"x{d.link_width} switch {d.upstream}" for d in gpus))


def test_driver_ioctls_of_a_cuda_workload_are_timed():
    import threading

    with GpuIoctlProbe(threshold_ns=1) as probe:
        seen = []
        probe.open(seen.append)
        worker = threading.Thread(target=cuda_workload, args=(3.0,))
        worker.start()
        time.sleep(1.0)  # the CUDA context is up: /dev/nvidia* fds are open
        fds = gpu_fds(("/dev/nvidia[0-9]*", "/dev/nvidia-uvm"), pids=[os.getpid()])
        assert fds, "the CUDA workload opened no /dev/nvidia* fd"
        probe.set_watched(fds.keys())
        while worker.is_alive():
            probe.poll(100)
        probe.poll(0)
        gpus, _ = process_gpus(os.getpid())
    assert seen and all((e.pid, e.fd) in fds for e in seen)
    latencies = sorted(e.latency_ns for e in seen)
    print(f"\n[gpu] {len(seen)} driver ioctls on {sorted(set(fds.values()))}; "
          f"p50 {latencies[len(latencies) // 2] / 1e3:.0f} us, max {latencies[-1] / 1e6:.1f} ms; GPUs {gpus}")
