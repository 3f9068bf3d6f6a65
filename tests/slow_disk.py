# SPDX-License-Identifier: Apache-2.0
"""A real block device whose reads take a time the test sets, whatever the
host's disk does: a loop device (/dev/loopN) over a file on a FUSE file
system (tests/fuse_files.py) whose read handler sleeps ``delay_ms`` before
it answers.

A read of /dev/loopN past the page cache (O_DIRECT) is real block I/O: the
block layer's tracepoints see a request to loopN, and the reading thread
sleeps uninterruptibly (io_schedule) until the loop driver's worker has read
the backing file -- through FUSE, whose file is opened with FOPEN_DIRECT_IO,
so no page cache under it either -- and completes the request. Each FUSE
read is at most 128 KiB (FUSE's default max_pages), so a read of the device
of N bytes waits at least ceil(N / 128 KiB) x ``delay_ms`` (measured here at
20 ms a read: 128 KiB took 20.3-21.2 ms, 1 MiB 9 FUSE reads and 182-184 ms;
the loop driver's direct I/O on or off made no difference).

This machine's kernel has loop devices but no device-mapper (no dm-delay),
null_blk, nbd or ublk: this is the way to a slow disk here. ``SlowDisk`` sets
it up and takes it down (also when the test fails); a run killed before it
could is cleaned up by the next (`remove_stale`).
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from tests.fuse_files import FUSE_READ, MNT_DETACH, MS_RDONLY, FuseFiles, umount

READ_IN = struct.Struct("<QQI")  # fuse_read_in, its start: fh offset size
MOUNT_PREFIX = "jitterscope-slowdisk-"  # then the owning pid: what remove_stale goes by


class SlowFile(FuseFiles):
    """One read-only file, ``disk``, of ``size`` zero bytes; each read sleeps
    ``delay_ns`` before it answers. ``reads`` counts the reads answered."""

    def __init__(self, size: int, delay_ns: int):
        super().__init__(["disk"], size, mode=0o444)
        self.delay_ns = delay_ns
        self.reads = 0

    def answer(self, opcode: int, node: int, body: memoryview) -> tuple[bytes, int] | tuple[bytes]:
        if opcode != FUSE_READ:
            return b"", errno.ENOSYS
        _fh, offset, size = READ_IN.unpack_from(body)
        time.sleep(self.delay_ns / 1e9)
        self.reads += 1
        return (bytes(max(0, min(size, self.size - offset))),)


class SlowDisk:
    """``with SlowDisk(delay_ms=20) as disk:`` -- ``disk.device`` is the
    loop device's path (/dev/loopN), ``disk.name`` its kernel name (loopN),
    ``disk.file.reads`` the FUSE reads served so far. ``direct_io``: the loop
    driver reads its backing file with O_DIRECT (losetup --direct-io);
    either way FOPEN_DIRECT_IO keeps the page cache out. Needs root."""

    def __init__(self, delay_ms: float, size_mb: int = 256, direct_io: bool = False):
        self.file = SlowFile(size_mb << 20, int(delay_ms * 1e6))
        self.direct_io = direct_io
        self.device = self.name = ""
        self.mountpoint = ""
        self._fuse = -1

    def __enter__(self) -> "SlowDisk":
        remove_stale()
        try:
            self.mountpoint = tempfile.mkdtemp(prefix=f"{MOUNT_PREFIX}{os.getpid()}-")
            self._fuse = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
            self.file.mount(self.mountpoint, self._fuse, "jsslowdisk", MS_RDONLY)
            self.device = subprocess.run(
                ["losetup", "--find", "--show", "--read-only", f"--direct-io={'on' if self.direct_io else 'off'}",
                 f"{self.mountpoint}/disk"], check=True, capture_output=True, text=True, timeout=60).stdout.strip()
            self.name = Path(self.device).name
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.device:
            subprocess.run(["losetup", "--detach", self.device], capture_output=True, timeout=60)
            self.device = ""
        if self.mountpoint:
            _unmount(self.mountpoint)
            self.mountpoint = ""
        if self._fuse >= 0:
            os.close(self._fuse)
            self._fuse = -1


def _unmount(mountpoint: str) -> None:
    """Unmount (lazily where the loop driver still holds the file: it lets
    go when the device's last user closes it) and remove the directory."""
    try:
        umount(mountpoint)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            umount(mountpoint, MNT_DETACH)
        elif exc.errno != errno.EINVAL:  # EINVAL: not mounted (any more)
            raise
    shutil.rmtree(mountpoint, ignore_errors=True)


def remove_stale() -> None:
    """Loop devices and mounts a SlowDisk of a process that is gone left
    behind (killed before it could clean up)."""
    listing = subprocess.run(["losetup", "--list", "--noheadings", "--raw", "--output", "NAME,BACK-FILE"],
                             capture_output=True, text=True, timeout=60).stdout
    for line in listing.splitlines():
        device, _, back = line.partition(" ")
        if _stale(back):
            subprocess.run(["losetup", "--detach", device], capture_output=True, timeout=60)
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        if _stale(target):
            _unmount(target)


def _stale(path: str) -> bool:
    """A path under a SlowDisk mount of a process that no longer runs."""
    name = next((part for part in Path(path).parts if part.startswith(MOUNT_PREFIX)), "")
    pid = name[len(MOUNT_PREFIX):].split("-", 1)[0]
    return pid.isdigit() and not Path(f"/proc/{pid}").exists()
