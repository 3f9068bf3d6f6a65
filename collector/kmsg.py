# SPDX-License-Identifier: Apache-2.0
"""A follower of the kernel log, /dev/kmsg: the records written after it
opened, one by one, without blocking. The xid probe (collector/probes/xid.py)
reads the NVIDIA driver's Xid lines through it.

Why /dev/kmsg and not dmesg or syslog: each read(2) returns exactly one
record with its sequence number and the kernel's timestamp (µs of the
kernel's clock since boot), no daemon sits in between, and a reader keeps
its own position. The file is opened non-blocking and positioned at the end
(``lseek(SEEK_END)``), so old lines are never replayed at start; ``read``
takes what has come since, and returns when nothing more has (EAGAIN): the
agent's loop calls it often, so no thread of its own is needed.

When the ring buffer overwrites records this reader had not read yet, the
kernel answers the next read with EPIPE and moves the reader to the oldest
record it still holds; the follower carries on from there and counts the
records it lost from the gap in sequence numbers (``lost``).

The kernel's timestamps are its scheduler clock (local_clock), not
CLOCK_MONOTONIC; ``clock_offset_ns`` reads how far apart they are, where
debugfs shows it, so a record's time can be put on CLOCK_MONOTONIC.

Record format (Documentation/ABI/testing/dev-kmsg):
``<prio>,<seq>,<usec>,<flags>[,...];<message>\\n`` followed by optional
continuation lines `` KEY=value\\n`` (device properties), which are dropped.
``prio`` is the syslog facility * 8 + level. The facility tells who wrote
the record: 0 (``KERNEL``) is the kernel's own printk, drivers included;
a write to /dev/kmsg from user space, root's too, is given 1 (user) or
whatever non-zero facility it asks for, never 0 (devkmsg_write). So only
facility 0 is the kernel's word; the text of a kernel record may still
quote a user's words (a mount option, a process name), so a reader also
checks where in the message its pattern is.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Callable, NamedTuple

#: the kernel's own records (printk); user-space writes never get it
KERNEL = 0

#: a kmsg record is at most this long (the kernel's own limit is 8 KiB less a header)
RECORD_BYTES = 8192


#: the scheduler's debug header: CLOCK_MONOTONIC ("ktime") and the clock
#: printk stamps records with ("cpu_clk", local_clock), side by side, in ms
SCHED_DEBUG = Path("/sys/kernel/debug/sched/debug")
_CLOCK_LINE = re.compile(r"^(ktime|cpu_clk)\s*:\s*(\d+)\.(\d{6})\s*$", re.M)


#: header reads per offset: the largest is kept (see clock_offset_ns)
OFFSET_READS = 5
#: bytes read of it: the clock lines are in its first 250 or so; a read past
#: the header's record (about 500) makes the kernel print CPU 0 and its tasks
#: too (4 ms, not 0.5, on a busy 2-core box)
HEADER_BYTES = 384


def clock_offset_ns(path: Path = SCHED_DEBUG, reads: int = OFFSET_READS) -> int | None:
    """CLOCK_MONOTONIC minus the kernel log's clock, in ns, from the
    scheduler's debug file (debugfs, root); None where it cannot be read.
    The two clocks differ (0.6 ms here after 13 h up) and drift apart: NTP
    slews CLOCK_MONOTONIC, not the scheduler clock. Only the start of the
    header is read (``HEADER_BYTES``): the file goes on with every CPU and task.

    The kernel reads ktime first, then cpu_clk, with interrupts off; in a VM
    the hypervisor can still stop the vCPU between the two, and then cpu_clk
    is late and the offset too small by the stall (an Xid stamped that much
    early). A stall can only make it smaller, so the largest of ``reads``
    reads is kept: the tightest, as clock.sample_offset keeps its bracket."""
    best = None
    for _ in range(reads):
        one = _one_offset_ns(path)
        if one is None:
            return None
        best = one if best is None else max(best, one)
    return best


def _one_offset_ns(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES).decode("ascii", errors="replace")
    except OSError:
        return None
    found = {name: int(ms) * 1_000_000 + int(frac) for name, ms, frac in _CLOCK_LINE.findall(head)}
    if len(found) != 2:
        return None
    return found["ktime"] - found["cpu_clk"]


class KmsgRecord(NamedTuple):
    seq: int
    usec: int  # the kernel's timestamp: µs since boot
    priority: int  # syslog facility * 8 + level
    message: str

    @property
    def facility(self) -> int:
        """0 (``KERNEL``): the kernel's printk; else a user-space write."""
        return self.priority >> 3


def parse_record(data: bytes) -> KmsgRecord | None:
    """One read(2)'s bytes as a record; None when they are not one."""
    header, sep, rest = data.partition(b";")
    fields = header.split(b",")
    if not sep or len(fields) < 3:
        return None
    try:
        priority, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    message = rest.split(b"\n", 1)[0]  # continuation lines (" KEY=value") are device properties
    return KmsgRecord(seq, usec, priority, message.decode("utf-8", errors="replace"))


class KmsgFollower:
    """The records the kernel logs from now on. ``read`` is injectable for
    tests (the EPIPE path cannot be provoked on a shared machine without
    flooding its log)."""

    def __init__(self, path: str = "/dev/kmsg", read: Callable[[int, int], bytes] = os.read):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            os.close(self.fd)
            raise
        self._read = read
        self._last_seq: int | None = None
        self.lost = 0  # records overwritten before they were read
        self.bad = 0  # reads that were not a record

    def records(self, limit: int = 1000) -> list[KmsgRecord]:
        """What the kernel logged since the last call (at most ``limit``:
        the agent's loop has other work; the rest comes next time)."""
        out: list[KmsgRecord] = []
        while len(out) < limit and self.fd >= 0:
            try:
                data = self._read(self.fd, RECORD_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten: the position moved on to the oldest kept
                    continue
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            record = parse_record(data)
            if record is None:
                self.bad += 1
                continue
            if self._last_seq is not None and record.seq > self._last_seq + 1:
                self.lost += record.seq - self._last_seq - 1
            self._last_seq = record.seq
            out.append(record)
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
