# SPDX-License-Identifier: Apache-2.0
"""common/untrusted.py: a file another process controls is opened without
blocking and checked before a byte is read (issue 40, item 3). A FIFO with
no writer would block a plain open() for good; here it is refused at once."""

from __future__ import annotations

import os
import time

import pytest

from jitterscope.common import untrusted
from jitterscope.common.untrusted import UntrustedFile


def test_a_regular_file_opens_and_reads(tmp_path):
    path = tmp_path / "lib.so"
    path.write_bytes(b"\x7fELF" + b"\0" * 60)
    with untrusted.open_file(path, max_size=64, owners={os.getuid()}) as f:
        assert f.read(4) == b"\x7fELF"
    assert untrusted.stat_file(path).st_size == 64


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "python3.11"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(UntrustedFile, match=r"not a regular file \(a FIFO\)") as refused:
        untrusted.open_file(fifo)
    assert time.monotonic() - started < 1
    assert isinstance(refused.value, OSError) and refused.value.filename == str(fifo)


def test_a_symbolic_link_is_refused_unless_a_magic_link_is_asked_for(tmp_path):
    target = tmp_path / "real"
    target.write_bytes(b"x")
    link = tmp_path / "libc.so.6"
    link.symlink_to(target)
    with pytest.raises(OSError) as refused:
        untrusted.open_fd(link)
    assert refused.value.errno == 40  # ELOOP: O_NOFOLLOW
    # /proc/self/fd/N and /proc/PID/map_files/... are links to the very file
    fd = os.open(target, os.O_RDONLY)
    try:
        with untrusted.open_file(f"/proc/self/fd/{fd}", magic_link=True) as f:
            assert f.read() == b"x"
    finally:
        os.close(fd)


def test_a_magic_link_to_a_fifo_is_still_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(UntrustedFile, match="a FIFO"):
            untrusted.open_fd(f"/proc/self/fd/{fd}", magic_link=True)
    finally:
        os.close(fd)


def test_devices_and_folders_are_refused(tmp_path):
    with pytest.raises(UntrustedFile, match="a character device"):
        untrusted.stat_file("/dev/null")
    with pytest.raises(UntrustedFile, match="a directory"):
        untrusted.stat_file(tmp_path)


def test_size_and_owner_bounds(tmp_path):
    path = tmp_path / "perf-1.map"
    with open(path, "wb") as f:
        f.truncate(64 << 30)  # sparse: 64 GB that take no space
    with pytest.raises(UntrustedFile, match=f"{64 << 30} bytes, more than the 1024"):
        untrusted.stat_file(path, max_size=1024)
    with pytest.raises(UntrustedFile, match=f"owned by uid {os.getuid()}, none of"):
        untrusted.stat_file(path, owners={os.getuid() + 1})
