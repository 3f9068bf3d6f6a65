# SPDX-License-Identifier: Apache-2.0
"""Kernel monotonic time to epoch nanoseconds.

``bpf_ktime_get_ns()`` is CLOCK_MONOTONIC, the same clock as
``time.monotonic_ns()``. The offset to the wall clock drifts (NTP slews the
wall clock, not the monotonic one), so it is re-sampled periodically; each
sample brackets the wall-clock read between two monotonic reads and keeps the
tightest bracket of a few tries.
"""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], int]


def sample_offset(
    monotonic: Clock = time.monotonic_ns, wall: Clock = time.time_ns, tries: int = 5
) -> int:
    """Return wall - monotonic, in ns, from the tightest of ``tries`` brackets."""
    best_width, best_offset = None, 0
    for _ in range(tries):
        before = monotonic()
        now = wall()
        after = monotonic()
        width = after - before
        if best_width is None or width < best_width:
            best_width, best_offset = width, now - (before + width // 2)
    return best_offset


class EpochConverter:
    """Converts monotonic ns to epoch ns with an offset re-sampled every
    ``resample_ns`` of monotonic time."""

    def __init__(
        self,
        monotonic: Clock = time.monotonic_ns,
        wall: Clock = time.time_ns,
        resample_ns: int = 10_000_000_000,
    ):
        self._monotonic = monotonic
        self._wall = wall
        self._resample_ns = resample_ns
        self._offset = sample_offset(monotonic, wall)
        self._sampled_at = monotonic()

    @property
    def offset_ns(self) -> int:
        return self._offset

    def to_epoch(self, monotonic_ns: int) -> int:
        now = self._monotonic()
        if now - self._sampled_at >= self._resample_ns:
            self._offset = sample_offset(self._monotonic, self._wall)
            self._sampled_at = now
        return monotonic_ns + self._offset
