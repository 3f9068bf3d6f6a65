# SPDX-License-Identifier: Apache-2.0
"""streams/rolling_median.py: the rolling median is statistics.median of the
last N values, whatever they are (seeded random streams with repeats)."""

from __future__ import annotations

import random
import statistics
from collections import deque

import pytest

from jitterscope.streams.rolling_median import RollingMedian


@pytest.mark.parametrize("seed", range(5))
def test_the_rolling_median_is_the_median_of_the_window(seed):
    rng = random.Random(seed)
    size = rng.choice([1, 2, 5, 500])
    rolling, window = RollingMedian(size), deque(maxlen=size)
    for _ in range(2_000):
        value = rng.choice([rng.randrange(10), rng.randrange(10**12)])
        rolling.append(value)
        window.append(value)
        assert len(rolling) == len(window)
        assert rolling.median() == statistics.median(window)


def test_an_empty_window_keeps_nothing():
    rolling = RollingMedian(0)
    rolling.append(5)
    assert len(rolling) == 0
