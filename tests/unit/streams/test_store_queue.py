# SPDX-License-Identifier: Apache-2.0
"""The queue between an agent's judge and its store (streams/store_queue.py)."""

import asyncio
import time

from jitterscope.streams.store_queue import StoreQueue


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_a_full_batch_is_taken_at_once_and_a_partial_one_after_within():
    async def scenario():
        full = StoreQueue(batch=10, limit=100, within_s=600)
        await full.put("a", 6)
        await full.put("b", 4)
        assert await asyncio.wait_for(full.take(), 60) == ["a", "b"]  # full: no wait for within_s (600 s)
        partial = StoreQueue(batch=10, limit=100, within_s=0.3)
        t0 = time.monotonic()
        await partial.put("c", 1)
        assert await partial.take() == ["c"]
        assert time.monotonic() - t0 >= 0.3  # partial: waited for more until within_s
        assert partial.records == 0

    run(scenario())


def test_take_waits_for_the_first_item():
    async def scenario():
        queue = StoreQueue(batch=2, limit=4, within_s=0.05)
        taker = asyncio.ensure_future(queue.take())
        await asyncio.sleep(0.1)
        assert not taker.done()
        await queue.put("x", 1)
        return await taker

    assert run(scenario()) == ["x"]


def test_put_waits_while_the_queue_is_full_and_the_judge_runs_ahead_until_then():
    async def scenario():
        queue = StoreQueue(batch=2, limit=4, within_s=10)
        for item in "abcd":
            await queue.put(item, 1)  # up to the limit: no wait
        blocked = asyncio.ensure_future(queue.put("e", 1))
        await asyncio.sleep(0.1)
        assert not blocked.done() and queue.records == 4
        assert await queue.take() == list("abcd")
        await blocked
        return queue.records

    assert run(scenario()) == 1


def test_a_message_of_no_records_still_counts():
    """A message that was all dead letters holds no records but must be stored and acked."""
    async def scenario():
        queue = StoreQueue(batch=1, limit=1, within_s=10)
        await queue.put("dead-only", 0)
        return await queue.take()

    assert run(scenario()) == ["dead-only"]
