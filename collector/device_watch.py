# SPDX-License-Identifier: Apache-2.0
"""When to look for GPU device fds again: only after a device file was
opened or closed (inotify), not every rescan interval.

Finding which processes hold a GPU open means reading every fd of every
process on the host: 20-30 ms of the collector's CPU each time
(bench/run.py collector-slices), every 2 s, whether or not anything changed,
and on a host with no GPU at all. The kernel can say when it is worth it:
inotify reports each open and close of a watched file by anyone (a process
that exits closes its files), and a new device file appearing in a watched
directory. So the scan runs at start, after such an event, and once every
BACKSTOP_S in case something was missed; and never where no device file
exists and none has appeared (a host with no GPU).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import time
from pathlib import Path
from typing import Iterable

log = logging.getLogger("jitterscope.collector")

IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_OPEN = 0x8, 0x10, 0x20
IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x80, 0x100, 0x200
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
FILE_EVENTS = IN_OPEN | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE
# A directory's IN_OPEN would report every open of every file in it (/dev/null
# included): only files coming and going there.
DIRECTORY_EVENTS = IN_CREATE | IN_DELETE | IN_MOVED_TO
BACKSTOP_S = 60.0


def _directory_of(pattern: str) -> str:
    """The longest leading directory of a shell pattern without a wildcard."""
    parts = []
    for part in Path(pattern).parent.parts:
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    return str(Path(*parts)) if parts else "/"


class DeviceOpens:
    """Says whether a rescan is due (:meth:`due`). Where inotify cannot be
    used (no such syscall, the watch limit reached), every call is due: the
    rescans cost what they did, nothing is missed."""

    def __init__(self, patterns: Iterable[str], backstop_s: float = BACKSTOP_S, clock=time.monotonic):
        self.patterns = list(patterns)
        self.backstop_s, self._clock = backstop_s, clock
        self._last_scan: float | None = None
        self._devices: set[str] = set()  # the device files watched: the backstop runs only where some exist
        self._fd = -1
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.info("no inotify: GPU device fds are looked for at every rescan",
                     extra={"errno": ctypes.get_errno()})
            return
        self._fd = fd
        for directory in sorted({_directory_of(p) for p in self.patterns}):
            self._libc.inotify_add_watch(self._fd, directory.encode(), DIRECTORY_EVENTS)  # absent: no device to appear

    @property
    def watching(self) -> bool:
        return self._fd >= 0

    def _watch_devices(self) -> None:
        """Watch every device file the patterns match now (new ones since the last call)."""
        for pattern in self.patterns:
            for path in glob.glob(pattern):
                if path in self._devices:
                    continue
                if self._libc.inotify_add_watch(self._fd, path.encode(), FILE_EVENTS) >= 0:
                    self._devices.add(path)
                else:
                    log.info("cannot watch a GPU device file: its fds are looked for at every rescan",
                             extra={"path": path, "errno": ctypes.get_errno()})
                    self.close()
                    return

    def _drain(self) -> bool:
        """Read every pending event; whether there was any (a queue overflow's
        IN_Q_OVERFLOW is one too: the next scan misses nothing)."""
        seen = False
        while True:
            try:
                seen |= bool(os.read(self._fd, 64 * 1024))
            except BlockingIOError:
                return seen
            except OSError:  # closed under us: the safe answer
                return True

    def due(self) -> bool:
        """Whether the processes' fds should be read again now (and, when it
        says so, that read is taken as done: events after this call make the
        next one due)."""
        now = self._clock()
        if not self.watching:
            return True
        changed = self._drain()
        first = self._last_scan is None
        backstop = not first and self._devices and now - self._last_scan >= self.backstop_s
        if not (changed or first or backstop):
            return False
        self._watch_devices()  # a device file that appeared, before the scan: no open missed
        self._last_scan = now
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
