# SPDX-License-Identifier: Apache-2.0
"""collector/clock.py: monotonic -> epoch with bracketed offset samples."""

from jitterscope.collector.clock import EpochConverter, sample_offset


def seq_clock(values):
    it = iter(values)
    return lambda: next(it)


def test_sample_offset_uses_the_tightest_bracket():
    # three tries: brackets (100,140) width 40, (200,210) width 10, (300,360) width 60
    mono = seq_clock([100, 140, 200, 210, 300, 360])
    wall = seq_clock([5_000, 6_000, 7_000])
    # tightest: wall 6_000 read between 200 and 210, midpoint 205
    assert sample_offset(mono, wall, tries=3) == 6_000 - 205


def test_sample_offset_first_of_equal_brackets_wins():
    mono = seq_clock([0, 10, 100, 110])
    wall = seq_clock([1_000, 9_999])
    assert sample_offset(mono, wall, tries=2) == 1_000 - 5


def test_sample_offset_makes_tries_samples():
    calls = {"wall": 0}

    def wall():
        calls["wall"] += 1
        return 10**18

    mono = iter(range(1000))
    # every bracket is 1 ns wide; the first (0, 1) wins, midpoint 0
    assert sample_offset(lambda: next(mono), wall, tries=5) == 10**18
    assert calls["wall"] == 5


class FakeTime:
    """Monotonic time that only moves when told; wall = monotonic + offset."""

    def __init__(self, mono: int, offset: int):
        self.mono = mono
        self.offset = offset
        self.wall_reads = 0

    def monotonic(self) -> int:
        return self.mono

    def wall(self) -> int:
        self.wall_reads += 1
        return self.mono + self.offset


def test_to_epoch_adds_the_offset():
    t = FakeTime(mono=50_000, offset=1_700_000_000_000_000_000)
    conv = EpochConverter(t.monotonic, t.wall, resample_ns=10_000)
    assert conv.offset_ns == 1_700_000_000_000_000_000
    assert conv.to_epoch(42_000) == 42_000 + 1_700_000_000_000_000_000


def test_offset_is_resampled_after_resample_ns():
    t = FakeTime(mono=50_000, offset=1_000_000)
    conv = EpochConverter(t.monotonic, t.wall, resample_ns=10_000)
    reads = t.wall_reads

    t.offset = 2_000_000  # the wall clock was stepped (NTP)
    t.mono += 9_999
    assert conv.to_epoch(100) == 100 + 1_000_000  # not yet
    assert t.wall_reads == reads

    t.mono += 1
    assert conv.to_epoch(100) == 100 + 2_000_000  # re-sampled
    assert conv.offset_ns == 2_000_000
    assert t.wall_reads > reads

    reads = t.wall_reads
    t.mono += 9_999
    t.offset = 3_000_000
    assert conv.to_epoch(100) == 100 + 2_000_000  # the window restarts at the re-sample
    assert t.wall_reads == reads
