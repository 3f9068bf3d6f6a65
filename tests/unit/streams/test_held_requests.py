# SPDX-License-Identifier: Apache-2.0
"""streams/attribution_stage.py's HeldRequests: a request message is acked
once every span it brought is attributed, never before; a message with
nothing left to attribute is acked at once; a partition that moved away
leaves its messages unacked (its next owner reads them again)."""

from __future__ import annotations

import asyncio

from jitterscope.streams.attribution_stage import HeldRequests


def run(acks) -> None:
    async def all_of():
        for ack in acks:
            await ack
    asyncio.run(all_of())


class Acks(list):
    """The names of the messages acked, in order."""

    def of(self, name: str):
        async def ack() -> None:
            self.append(name)
        return ack


def test_a_message_is_acked_once_all_its_spans_are_attributed():
    acked = Acks()
    held = HeldRequests()
    assert held.hold(0, [("h", "b", 1), ("h", "b", 2)], acked.of("m1")) is None
    assert held.hold(0, [("h", "b", 3)], acked.of("m2")) is None
    run(held.release([("h", "b", 1), ("h", "b", 3)]))
    assert acked == ["m2"] and len(held) == 1
    run(held.release([("h", "b", 2)]))
    assert acked == ["m2", "m1"] and len(held) == 0
    run([held.hold(0, [], acked.of("m3"))])  # every span attributed before: acked now
    assert acked[-1] == "m3"


def test_the_same_span_read_twice_releases_both_messages():
    acked = Acks()
    held = HeldRequests()
    held.hold(1, [("h", "b", 1)], acked.of("first read"))
    held.hold(1, [("h", "b", 1)], acked.of("read again after a rebalance"))
    run(held.release([("h", "b", 1)]))
    assert sorted(acked) == ["first read", "read again after a rebalance"]


def test_messages_of_a_partition_let_go_are_never_acked():
    acked = Acks()
    held = HeldRequests()
    held.hold(0, [("a", "b", 1)], acked.of("kept"))
    held.hold(2, [("c", "b", 1)], acked.of("moved"))
    held.drop({2})
    run(held.release([("a", "b", 1), ("c", "b", 1)]))
    assert acked == ["kept"] and len(held) == 0


def test_letting_go_forgets_the_spans_only_those_messages_waited_for():
    acked = Acks()
    held = HeldRequests()
    held.hold(2, [("c", "b", 1), ("c", "b", 2)], acked.of("moved"))
    held.hold(0, [("c", "b", 2)], acked.of("kept, sharing a span"))
    held.drop({2})
    assert set(held._by_span) == {("c", "b", 2)}  # nothing stale left behind
    run(held.release([("c", "b", 2)]))
    assert acked == ["kept, sharing a span"]
