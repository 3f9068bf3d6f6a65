# SPDX-License-Identifier: Apache-2.0
"""The median (and any quantile) of the last N values, kept sorted as they come and go.

streams/attribution.py asks two medians per request (its baseline and its
usual self-contention), each over up to 500 samples: statistics.median
sorted the window every time, ~35 us a request on the vLLM mix, most of the
per-request budget of issue 39 (50 us). Here an append is two bisects and
a memmove, and the median is read from the middle. Pure logic, no I/O.
"""

from __future__ import annotations

import bisect
from collections import deque


class RollingMedian:
    """The last ``maxlen`` values appended, and their median as statistics.median gives it."""

    __slots__ = ("_window", "_sorted")

    def __init__(self, maxlen: int):
        self._window: deque[int] = deque(maxlen=maxlen)
        self._sorted: list[int] = []

    def append(self, value: int) -> None:
        if not self._window.maxlen:
            return
        if len(self._window) == self._window.maxlen:  # the oldest leaves the window as this one comes
            del self._sorted[bisect.bisect_left(self._sorted, self._window[0])]
        self._window.append(value)
        bisect.insort(self._sorted, value)

    def __len__(self) -> int:
        return len(self._window)

    def median(self) -> float | int:
        """statistics.median of the window: the middle value, or the mean of the two middle ones."""
        n = len(self._sorted)
        if n % 2:
            return self._sorted[n // 2]
        return (self._sorted[n // 2 - 1] + self._sorted[n // 2]) / 2

    def quantile(self, q: float) -> int:
        """The value a share ``q`` of the window is at or under (nearest rank; 0 when empty)."""
        if not self._sorted:
            return 0
        return self._sorted[min(len(self._sorted) - 1, int(q * len(self._sorted)))]
