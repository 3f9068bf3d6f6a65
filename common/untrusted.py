# SPDX-License-Identifier: Apache-2.0
"""Opening a file that another process controls: a path taken from
``/proc/PID/maps``, a process's ``/tmp/perf-PID.map``, its binary or its
libraries (issue 40, item 3; docs/security.md).

Any local user can name such a path. It may be a FIFO (a plain ``open()``
blocks until someone writes to it: the collector's main thread stopped there
for good), a device (opening one can have effects: a tty becomes the
controlling terminal, a watchdog is armed), a symbolic link to any of those,
or a sparse file of many gigabytes. Hence, here and only here:

- ``O_NONBLOCK``: opening a FIFO returns at once, and the ``fstat`` that
  follows refuses it; ``O_NOCTTY``: a tty is never taken as ours;
- ``O_NOFOLLOW``: a final symbolic link is refused, except for the kernel's
  magic links (``/proc/PID/map_files/...``, ``/proc/self/fd/N``), which name
  the very file a process has mapped or opened and are asked for by
  ``magic_link=True``;
- ``fstat`` before any byte is read: a regular file, at most ``max_size``
  bytes, owned by one of ``owners`` where that matters.

A library that opens a path itself (libbcc) is handed ``/proc/self/fd/N`` of
a file opened and checked here, never the path it came from: what it opens
is then the very file that was checked.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, Collection

FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class UntrustedFile(OSError):
    """A file another process controls is not one to read: not a regular
    file, too large, or not its owner's. An OSError (``strerror`` says why),
    so a caller's ``except OSError`` also covers it."""

    def __init__(self, path: str, why: str):
        super().__init__(errno.EINVAL, why, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def check(st: os.stat_result, path: str, max_size: int | None = None,
          owners: Collection[int] | None = None) -> os.stat_result:
    """``st`` (an ``fstat``, or the ``stat`` of a path some library will
    open itself) if it is a regular file within the bounds, else
    :class:`UntrustedFile`."""
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedFile(path, f"not a regular file ({_kind(st.st_mode)})")
    if max_size is not None and st.st_size > max_size:
        raise UntrustedFile(path, f"{st.st_size} bytes, more than the {max_size} a sane one has")
    if owners is not None and st.st_uid not in owners:
        raise UntrustedFile(path, f"owned by uid {st.st_uid}, none of {sorted(owners)}")
    return st


def open_fd(path: str | os.PathLike, *, magic_link: bool = False, max_size: int | None = None,
            owners: Collection[int] | None = None) -> int:
    """A raw fd of ``path`` opened as the module says and checked; the
    caller closes it. Raises OSError (:class:`UntrustedFile` for a file that
    opened but is not one to read: it is closed then)."""
    path = os.fspath(path)
    fd = os.open(path, FLAGS & ~os.O_NOFOLLOW if magic_link else FLAGS)
    try:
        check(os.fstat(fd), path, max_size, owners)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: str | os.PathLike, *, magic_link: bool = False, max_size: int | None = None,
              owners: Collection[int] | None = None) -> BinaryIO:
    """:func:`open_fd` as a binary file object (unbuffered: readers seek)."""
    return os.fdopen(open_fd(path, magic_link=magic_link, max_size=max_size, owners=owners), "rb", buffering=0)


def stat_file(path: str | os.PathLike, *, magic_link: bool = False, max_size: int | None = None,
              owners: Collection[int] | None = None) -> os.stat_result:
    """Whether ``path`` is a file to read, without keeping it open: its
    ``fstat``, or OSError."""
    fd = open_fd(path, magic_link=magic_link, max_size=max_size, owners=owners)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"mode {mode:o}"
