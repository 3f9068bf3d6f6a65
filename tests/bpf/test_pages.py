# SPDX-License-Identifier: Apache-2.0
"""The page-placement probe on the real kernel: a process that reads a 64 MiB
file no longer in the page cache brings ~16k pages in on this host's one
node; a process that only sleeps brings in nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jitterscope.collector import hostinfo
from jitterscope.collector.probes.pages import UNKNOWN_NODE, PageProbe, merge_ranges

pytestmark = pytest.mark.bpf

FILE_PAGES = 64 * 1024 * 1024 // 4096
READER, IDLER = "jspages", "jsidle"

_CHILD = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
print("ready", flush=True)
sys.stdin.readline()
if len(sys.argv) > 2:
    fd = os.open(sys.argv[2], os.O_RDONLY)
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
print("done", flush=True)
sys.stdin.readline()
"""


def zone_ranges(zoneinfo: Path = Path("/proc/zoneinfo")) -> list[tuple[int, int, int]]:
    """(node, start_pfn, end_pfn) of every populated zone."""
    ranges, node, spanned = [], None, 0
    for line in zoneinfo.read_text().splitlines():
        if m := re.match(r"Node (\d+), zone", line):
            node, spanned = int(m.group(1)), 0
        elif m := re.match(r"\s+spanned\s+(\d+)", line):
            spanned = int(m.group(1))
        elif (m := re.match(r"\s+start_pfn:\s+(\d+)", line)) and spanned:
            ranges.append((node, int(m.group(1)), int(m.group(1)) + spanned))
    return ranges


def uncached_file(path: Path) -> Path:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(64):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path


def child(*args: str) -> subprocess.Popen:
    popen = subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert popen.stdout.readline().strip() == "ready"
    return popen


def step(popen: subprocess.Popen) -> None:
    popen.stdin.write("\n")
    popen.stdin.flush()
    assert popen.stdout.readline().strip() == "done"


def test_page_cache_pages_of_a_reader_land_on_its_node(tmp_path):
    ranges = zone_ranges()
    assert ranges and {node for node, _, _ in ranges} == {0}, "this host has one node"
    data = uncached_file(tmp_path / "data")
    reader, idler = child(READER, str(data)), child(IDLER)
    try:
        with PageProbe(ranges) as probe, PageProbe([(0, 0, 1)]) as nowhere:
            step(reader)
            step(idler)
            placed = probe.read()
            elsewhere = nowhere.read()
            again = probe.read()
            reader.stdin.close()  # let the reader exit: its counters go after the next read
            reader.wait()
            probe.read()
            assert not any(pid == reader.pid for pid, _ in probe.read())
            assert probe.drops() == nowhere.drops() == probe.map_full_drops() == nowhere.map_full_drops() == 0
    finally:
        for popen in (reader, idler):
            popen.kill()
            popen.wait()

    mine = placed[(reader.pid, 0)]
    assert mine.comm == READER
    # its memory cgroup, read with its counts (whose limit it filled: the evictor search)
    assert mine.memory_cgroup == hostinfo.cpu_cgroup_path(Path("/proc/self/cgroup").read_text(), "memory")
    assert mine.page_cache_pages >= 0.8 * FILE_PAGES
    assert mine.alloc_pages >= 0.8 * FILE_PAGES, "the cache pages were allocated in its context"
    assert {node for pid, node in placed if pid == reader.pid} == {0}
    idle = placed.get((idler.pid, 0))
    assert idle is None or idle.page_cache_pages < 256
    # a page outside every range the collector gave is on the unknown node
    assert elsewhere[(reader.pid, UNKNOWN_NODE)].page_cache_pages >= 0.8 * FILE_PAGES
    assert (reader.pid, 0) not in again


def test_ranges_of_a_node_merge_and_too_many_are_refused():
    assert merge_ranges([(0, 4096, 1048576), (0, 1, 4096), (1, 1048576, 2000000), (0, 2000000, 3000000)]) == [
        (0, 1, 1048576), (1, 1048576, 2000000), (0, 2000000, 3000000)]
    with pytest.raises(ValueError):
        PageProbe([(i % 2, i * 10, i * 10 + 5) for i in range(17)])
