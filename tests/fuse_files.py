# SPDX-License-Identifier: Apache-2.0
"""A FUSE file system of a few flat files, for the stand-ins tests put where
hardware would be: tests/gpu_standin.py (a GPU driver whose files answer
ioctls late) and tests/slow_disk.py (a disk whose file answers reads late).

It speaks the kernel's own FUSE protocol over /dev/fuse directly (no
libfuse, no PyPI package) and serves from a thread of the calling process,
one call at a time. ``FuseFiles`` answers what any file system must (init,
look-up, attributes, open, an empty listing, statfs); a subclass answers
the calls its files exist for (``answer``). Also here: mount(2), umount(2)
and unshare(2), which the stand-ins need around it, and why FUSE cannot run
(``fuse_unavailable``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import threading
import time
import traceback

# --- the kernel interfaces: unshare, mount ------------------------------------------

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x2, 0x4, 0x1000, 0x4000, 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0,
          data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source} on {target}")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def private_mount_namespace() -> None:
    """This process (call it before starting threads) gets its own copy of
    the mount table, and no mount made here propagates back."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def fuse_unavailable() -> str | None:
    """Why a FUSE file system cannot be mounted here, or None."""
    if os.geteuid() != 0:
        return "needs root (a FUSE mount, and for the GPU stand-in a private mount namespace)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1] == "fuse" for line in f if line.strip()):
                return "the kernel has no FUSE file system (CONFIG_FUSE_FS)"
    except OSError:
        pass
    return None


# --- the protocol: include/uapi/linux/fuse.h ----------------------------------------

FUSE_LOOKUP, FUSE_FORGET, FUSE_GETATTR = 1, 2, 3
FUSE_OPEN, FUSE_READ, FUSE_STATFS, FUSE_RELEASE, FUSE_FLUSH, FUSE_INIT = 14, 15, 17, 18, 25, 26
FUSE_OPENDIR, FUSE_READDIR, FUSE_RELEASEDIR, FUSE_INTERRUPT, FUSE_DESTROY = 27, 28, 29, 36, 38
FUSE_IOCTL, FUSE_BATCH_FORGET = 39, 42
FOPEN_DIRECT_IO, FOPEN_NONSEEKABLE = 1, 4
IN_HEADER = struct.Struct("<IIQQIIIHH")   # fuse_in_header: len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")        # fuse_out_header: len error unique
ATTR = struct.Struct("<6Q10I")            # fuse_attr
ROOT_ID = 1
FUSE_MINOR = 31  # what this server speaks; the kernel adapts to it
FILE_BLOCK = 4096


class FuseFiles:
    """A root directory of regular files ``names`` (node ids 2, 3, ...),
    each ``size`` bytes and ``mode``. Opened files get ``open_flags``
    (FOPEN_DIRECT_IO: every read and write reaches ``answer``, none is
    served from the page cache)."""

    open_flags = FOPEN_DIRECT_IO

    def __init__(self, names, size: int = 0, mode: int = 0o666):
        self.nodes = {i + 2: name for i, name in enumerate(names)}
        self.by_name = {name: node for node, name in self.nodes.items()}
        self.size = size
        self.mode = mode
        self.fd = -1
        self._thread: threading.Thread | None = None
        self._now = int(time.time())

    def mount(self, mountpoint: str, fuse_fd: int, name: str, flags: int = 0) -> None:
        """Mount as ``name`` on ``mountpoint`` (a directory) through ``fuse_fd``
        (an open /dev/fuse, now this file system's) and start serving."""
        self.fd = fuse_fd
        mount(name, mountpoint, f"fuse.{name}", MS_NOSUID | MS_NODEV | flags,
              f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other")
        self._thread = threading.Thread(target=self._serve, name=f"fuse-{name}", daemon=True)
        self._thread.start()

    def answer(self, opcode: int, node: int, body: memoryview) -> tuple[bytes, int] | tuple[bytes]:
        """The reply to a call the base does not answer: (payload,) or (b"", errno)."""
        return b"", errno.ENOSYS

    def _attr(self, node: int) -> bytes:
        root = node == ROOT_ID
        mode = stat.S_IFDIR | 0o755 if root else stat.S_IFREG | self.mode
        size = 0 if root else self.size
        return ATTR.pack(node, size, -(-size // 512), self._now, self._now, self._now, 0, 0, 0, mode,
                         2 if root else 1, 0, 0, 0, FILE_BLOCK, 0)

    def _reply(self, unique: int, payload: bytes = b"", error: int = 0) -> None:
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)
        except OSError as exc:  # ENOENT: the caller is gone (interrupted); ENODEV: unmounted
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def _serve(self) -> None:
        while True:
            try:
                message = os.read(self.fd, 1 << 18)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN):
                    continue
                return  # ENODEV: unmounted, the connection is gone
            _len, opcode, unique, node, _uid, _gid, _pid, _ext, _pad = IN_HEADER.unpack_from(message)
            body = memoryview(message)[IN_HEADER.size:]
            if opcode in (FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT):
                continue  # no answer expected (an interrupted call still gets its own)
            if opcode == FUSE_DESTROY:
                self._reply(unique)
                return
            try:
                reply = self._answer(opcode, node, body)
            except Exception:  # a bug here must fail the caller's call, not hang it
                traceback.print_exc()
                reply = (b"", errno.EIO)
            self._reply(unique, *reply)

    def _answer(self, opcode: int, node: int, body: memoryview) -> tuple[bytes, int] | tuple[bytes]:
        if opcode == FUSE_INIT:
            major, minor, max_readahead, _flags = struct.unpack_from("<IIII", body)
            if major != 7:
                return b"", errno.EPROTO
            # fuse_init_out: major minor max_readahead flags max_background congestion_threshold
            # max_write time_gran max_pages map_alignment flags2 max_stack_depth, then unused
            return (struct.pack("<IIIIHHIIHHII", 7, min(minor, FUSE_MINOR), max_readahead, 0, 16, 12,
                                1 << 17, 1, 32, 0, 0, 0) + bytes(24),)
        if opcode == FUSE_LOOKUP:
            name = bytes(body).split(b"\0", 1)[0].decode()
            found = self.by_name.get(name) if node == ROOT_ID else None
            if found is None:
                return b"", errno.ENOENT
            # fuse_entry_out: nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec attr
            return (struct.pack("<QQQQII", found, 0, 3600, 3600, 0, 0) + self._attr(found),)
        if opcode == FUSE_GETATTR:
            return (struct.pack("<QII", 3600, 0, 0) + self._attr(node),)
        if opcode in (FUSE_OPEN, FUSE_OPENDIR):
            flags = self.open_flags if opcode == FUSE_OPEN else 0
            return (struct.pack("<QIi", node, flags, 0),)  # fuse_open_out: fh open_flags backing_id
        if opcode in (FUSE_READDIR, FUSE_RELEASE, FUSE_RELEASEDIR, FUSE_FLUSH):
            return (b"",)  # an empty directory listing; nothing to release or flush
        if opcode == FUSE_STATFS:  # fuse_kstatfs: blocks bfree bavail files ffree bsize namelen frsize pad spare[6]
            return (struct.pack("<5Q4I", 0, 0, 0, len(self.nodes), 0, FILE_BLOCK, 255, FILE_BLOCK, 0) + bytes(24),)
        return self.answer(opcode, node, body)
