# SPDX-License-Identifier: Apache-2.0
"""In-kernel map-full failures are counted, per probe, apart from ring-buffer
drops: a probe compiled with a one-entry map (``BccProbe.defines``) on the
real kernel must count the updates that did not fit, and the same probe at its
real size, under the same activity, counts none."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from jitterscope.collector.probes.pages import PageProbe
from jitterscope.collector.probes.runq import RunqProbe
from tests.bpf.test_pages import zone_ranges

pytestmark = pytest.mark.bpf

MS = 1_000_000


def activity() -> None:
    """A few processes that wake, sleep and allocate: run-queue waits and
    page allocations from several pids."""
    code = "import time\nfor _ in range(20):\n    bytearray(1 << 20); time.sleep(0.005)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    for p in procs:
        p.wait(30)


def wait_until(condition, seconds: float = 10) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not condition():
        time.sleep(0.05)
    return condition()


class TinyRunq(RunqProbe):
    defines = {"MAX_HIST_KEYS": 1}  # one (pid, slot) histogram bucket on the whole host


class TinyPages(PageProbe):
    defines = {"MAX_KEYS": 1}  # one (pid, node) counter on the whole host


def test_a_full_runq_histogram_map_is_counted():
    with TinyRunq(threshold_ns=1_000 * MS, target_pids=None) as tiny, \
            RunqProbe(threshold_ns=1_000 * MS, target_pids=None) as normal:
        activity()
        assert wait_until(lambda: tiny.map_full_drops() > 0)
        assert len(tiny._bpf[b"hist"]) <= 1
        assert normal.map_full_drops() == 0 and len(normal.read_histograms()) > 1
        assert tiny.drops() == normal.drops() == 0  # ring-buffer drops are another count
        print(f"runq with 1 histogram key: {tiny.map_full_drops()} updates refused")


def test_a_full_page_counter_map_is_counted():
    ranges = zone_ranges()
    with TinyPages(ranges) as tiny, PageProbe(ranges) as normal:
        activity()
        assert wait_until(lambda: tiny.map_full_drops() > 0)
        assert len(tiny.read()) <= 1
        assert normal.map_full_drops() == 0 and len(normal.read()) > 1
        print(f"pages with 1 counter key: {tiny.map_full_drops()} updates refused")


def test_the_agent_sums_its_probes_losses():
    from types import SimpleNamespace

    from jitterscope.collector.agent import Collector
    from jitterscope.collector.probes.blockio import BlockIoSignal
    from jitterscope.collector.probes.pages import PagesSignal
    from jitterscope.common.settings import Settings

    collector = Collector(Settings(host="t"), publisher=SimpleNamespace())
    assert (collector.map_full_drops(), collector.ringbuf_drops()) == (0, 0)
    pages, blockio = PagesSignal(), BlockIoSignal()
    pages.probe = SimpleNamespace(map_full_drops=lambda: 3, drops=lambda: 0)
    blockio.probe = SimpleNamespace(map_full_drops=lambda: 4, drops=lambda: 1)
    collector.probes = [pages, blockio]
    assert (collector.map_full_drops(), collector.ringbuf_drops()) == (7, 1)
