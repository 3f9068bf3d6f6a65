# SPDX-License-Identifier: Apache-2.0
"""Files and folders only their owner may read: the data dir, the spool,
state files, recordings and reports hold process command lines (secrets, at
times).

- :func:`private_dir` creates a folder, and every missing folder above it,
  mode 0700, whichever part of jitterscope gets there first (``mkdir(mode=,
  parents=True)`` gives the parents the default 0755).
- :func:`open_private` opens a file for writing: created 0600, an existing
  one made 0600 before anything is written to it, and never through a
  symbolic link (``O_NOFOLLOW``), so a link planted where a file will be
  written cannot redirect it to, or expose, another file. Nor into a file
  another user made there first, a hard link or a FIFO: refused before
  anything is chmodded or emptied.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from jitterscope.common.errors import UnsafeFile

DIR_MODE = 0o700
FILE_MODE = 0o600


class SymlinkRefused(OSError):
    """The path to write is a symbolic link. ``str()`` is the whole sentence,
    for a caller's "cannot write X: {exc}"."""

    def __init__(self, path: Path | str):
        super().__init__(errno.ELOOP, "it is a symbolic link, which jitterscope does not write through "
                                      "(remove it or choose another path)", str(path))

    def __str__(self) -> str:
        return str(self.strerror)


def private_dir(path: Path | str) -> Path:
    """``path`` as a folder, created 0700 with every missing parent (0700
    too). Folders that exist are left as they are."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile (another part starting), or a file: checked below
            pass
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    return path


def open_private(path: Path | str, *, append: bool = False, truncate: bool = True) -> int:
    """A file descriptor open for writing on ``path``: created 0600, or, if
    it exists, made 0600 first (and emptied unless ``append`` or not
    ``truncate``). Raises :class:`SymlinkRefused` when ``path`` is a
    symbolic link, :class:`~jitterscope.common.errors.UnsafeFile` when it is
    another user's file, a hard link or a FIFO or socket (see
    :func:`_refuse_unsafe`); both before anything is changed."""
    # O_NONBLOCK: a FIFO planted at ``path`` would block open() until someone reads it
    flags = (os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
             | (os.O_APPEND if append else 0))
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise SymlinkRefused(path) from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads (O_NONBLOCK)
            raise UnsafeFile(errno.ENXIO, "it is a FIFO, not a regular file; remove it or choose another path",
                             str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        _refuse_unsafe(info, path)
        os.set_blocking(fd, True)  # a tty (--out /dev/tty) would answer EAGAIN otherwise
        if stat.S_ISREG(info.st_mode):  # not /dev/null and the like
            if info.st_mode & 0o077:  # an older file: private before anything is written (or emptied)
                os.fchmod(fd, FILE_MODE)
            if truncate and not append:
                os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_unsafe(info: os.stat_result, path: Path | str) -> None:
    """Raise UnsafeFile unless the open file is this user's own regular file
    with one name, or a character device (/dev/null, a tty: nothing is
    chmodded or emptied there, and no user can make one). Where another user
    may write the folder (/tmp), they could have made the file (or a hard
    link to a third file) first: root would then chmod, truncate and fill
    what they chose, and they could read or swap what was written."""
    if stat.S_ISCHR(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(errno.EINVAL, "it is not a regular file (a FIFO, socket or device); "
                                       "remove it or choose another path", str(path))
    if info.st_uid != os.geteuid():
        raise UnsafeFile(errno.EPERM, f"it belongs to another user (uid {info.st_uid}, not {os.geteuid()}); "
                                      "remove it or choose another path", str(path))
    if info.st_nlink > 1:
        raise UnsafeFile(errno.EMLINK, f"it has {info.st_nlink} hard links, so writing it would change another "
                                       "file too; remove it or choose another path", str(path))
