# SPDX-License-Identifier: Apache-2.0
"""base.Log2Histograms: reads deltas, and forgets exited processes' entries
from what the last read saw (no walk of the whole kernel map)."""

from collections import namedtuple

from jitterscope.collector.probes.base import Log2Histograms

Key = namedtuple("Key", "pid slot")


class Count:
    def __init__(self, value):
        self.value = value


class FakeMap(dict):
    """The part of a BCC hash map Log2Histograms uses; no batch calls (an
    old kernel): key by key."""

    Key = Key

    def items_lookup_batch(self):
        raise OSError("no batch ops")

    def items_delete_batch(self, keys):
        raise OSError("no batch ops")

    def keys(self):
        raise AssertionError("forget must not walk the map")


def test_forget_deletes_only_the_exited_processes_entries():
    table = FakeMap({Key(1, 3): Count(5), Key(1, 4): Count(1), Key(2, 3): Count(7)})
    histograms = Log2Histograms(table)
    assert histograms.read() == {1: {3: 5, 4: 1}, 2: {3: 7}}
    histograms.forget({1})
    assert set(table) == {Key(2, 3)}
    table[Key(2, 3)] = Count(9)
    assert histograms.read() == {2: {3: 2}}
