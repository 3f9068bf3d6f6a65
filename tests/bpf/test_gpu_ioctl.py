# SPDX-License-Identifier: Apache-2.0
"""The GPU-ioctl probe on the real kernel. This host has no GPU, so a helper
process stands in: it issues ioctls that fail fast (FIONREAD on /dev/zero is
ENOTTY) on a "device" fd the probe watches and on a pipe it does not; the
kernel times the calls all the same."""

from __future__ import annotations

import errno
import subprocess
import sys
import termios
import time
from contextlib import contextmanager

import pytest

from jitterscope.collector.probes.gpu_ioctl import GpuIoctlProbe, gpu_fds

DEVICE = "/dev/zero"
COMM = "jsioctl"

_HELPER = f"""
import ctypes, fcntl, os, sys, termios
ctypes.CDLL(None).prctl(15, {COMM!r}.encode(), 0, 0, 0)
device = os.open({DEVICE!r}, os.O_RDONLY)
other, _w = os.pipe()
print(device, other, flush=True)
for line in sys.stdin:
    for fd in (device, other):
        for _ in range(int(line)):
            try:
                fcntl.ioctl(fd, termios.FIONREAD, b"\\0\\0\\0\\0")
            except OSError:
                pass
    print("done", flush=True)
"""


class Helper:
    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid
        self.device_fd, self.other_fd = map(int, popen.stdout.readline().split())

    def ioctls(self, n: int) -> None:
        """n ioctls on the device fd, then n on the other one; returns when done."""
        self.popen.stdin.write(f"{n}\n")
        self.popen.stdin.flush()
        assert self.popen.stdout.readline().strip() == "done"


@contextmanager
def helper():
    popen = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        yield Helper(popen)
    finally:
        popen.kill()
        popen.wait()


def drain(probe: GpuIoctlProbe) -> None:
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        probe.poll(50)


@pytest.mark.bpf
def test_only_watched_fds_are_timed_and_unwatching_stops_them():
    with helper() as h:
        fds = gpu_fds(patterns=(DEVICE,), pids=[h.pid])
        assert fds == {(h.pid, h.device_fd): DEVICE}
        assert (h.pid, h.device_fd) in gpu_fds(patterns=(DEVICE,)), "a full /proc scan finds it too"
        with GpuIoctlProbe(threshold_ns=1, watched=fds) as probe:
            seen = []
            probe.open(seen.append)
            h.ioctls(50)
            drain(probe)
            hist = probe.read_histograms()

            assert len(seen) == 50, "every call on the watched fd, none on the other"
            assert {(e.pid, e.tid, e.fd, e.comm) for e in seen} == {(h.pid, h.pid, h.device_fd, COMM)}
            assert all(e.request == termios.FIONREAD and e.ret == -errno.ENOTTY for e in seen)
            assert all(e.latency_ns > 0 for e in seen)
            assert set(hist) == {h.pid} and sum(hist[h.pid].values()) == 50

            probe.set_watched(set())
            assert probe.watched() == set()
            assert not probe.attached, "nothing watched: no syscall of the host takes the traced path"
            h.ioctls(20)
            drain(probe)
            assert len(seen) == 50, "an unwatched pair leaves no events"
            assert probe.read_histograms() == {}, "nor histogram counts"
            assert probe.drops() == 0 and probe.map_full_drops() == 0


@pytest.mark.bpf
def test_calls_under_the_threshold_are_only_in_the_histogram():
    with helper() as h:
        with GpuIoctlProbe(threshold_ns=10 * 1_000_000_000) as probe:
            assert not probe.attached, "attached only once some fd is watched"
            probe.set_watched({(h.pid, h.device_fd)})
            assert probe.attached
            seen = []
            probe.open(seen.append)
            h.ioctls(30)
            drain(probe)
            first = probe.read_histograms()
            h.ioctls(10)
            second = probe.read_histograms()
    assert seen == []
    assert sum(first[h.pid].values()) == 30
    assert sum(second[h.pid].values()) == 10, "reads are deltas"
    assert min(first[h.pid]) <= 4, "a failing ioctl returns within microseconds"


def test_gpu_fds_matches_patterns_and_skips_the_control_device(tmp_path):
    links = {
        (100, 3): "/dev/nvidia0", (100, 4): "/dev/nvidiactl", (100, 5): "/dev/nvidia-uvm",
        (100, 6): "/dev/null", (200, 7): "/dev/nvidia1", (200, 8): "pipe:[1234]",
    }
    for (pid, fd), target in links.items():
        fd_dir = tmp_path / str(pid) / "fd"
        fd_dir.mkdir(parents=True, exist_ok=True)
        (fd_dir / str(fd)).symlink_to(target)
    (tmp_path / "self").mkdir()  # not a pid: ignored
    (tmp_path / "300").mkdir()   # no fd directory (gone, or not ours to read): skipped

    assert gpu_fds(proc=tmp_path) == {
        (100, 3): "/dev/nvidia0", (100, 5): "/dev/nvidia-uvm", (200, 7): "/dev/nvidia1",
    }
    assert gpu_fds(patterns=("/dev/nvidia*",), proc=tmp_path)[(100, 3)] == "/dev/nvidia0"
    assert (100, 4) not in gpu_fds(patterns=("/dev/nvidia*",), proc=tmp_path), "a broad pattern still skips it"
    assert gpu_fds(patterns=("/dev/nvidia*",), proc=tmp_path, exclude=())[(100, 4)] == "/dev/nvidiactl"
    assert gpu_fds(patterns=("/dev/nvidia[0-9]*",), proc=tmp_path, pids=[200]) == {(200, 7): "/dev/nvidia1"}
