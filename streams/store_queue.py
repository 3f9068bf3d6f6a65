# SPDX-License-Identifier: Apache-2.0
"""Between an agent's judge and its store: decoded messages wait here.

The judge (decode, rules, alerts) runs on every message as it arrives; the
store inserts what has gathered in large batches, then acks those messages
so that Faust may commit their offsets. With the two apart, an alert no
longer waits for the inserts ahead of it (a Faust ``take`` judges the next
message only after the batch before it is stored), and the judging of one
batch overlaps the insert of the last (chDB inserts on its own thread).

The queue is bounded in records: once ``limit`` records wait, the judge
waits too, so memory stays bounded under a ClickHouse slower than the input
(and the broker keeps the rest, uncommitted).
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class StoreQueue(Generic[T]):
    """``batch``: records that make a batch worth storing at once;
    ``limit``: records that may wait before ``put`` waits for room;
    ``within_s``: the longest a message waits for a batch to fill."""

    def __init__(self, batch: int, limit: int, within_s: float):
        self.batch, self.limit, self.within_s = batch, max(limit, batch), within_s
        self._items: list[T] = []
        self._records = 0
        self._oldest = 0.0  # monotonic time the oldest waiting item came
        self._ready = asyncio.Event()  # something came: take() looks again
        self._room = asyncio.Event()  # take() emptied the queue: put() looks again

    @property
    def records(self) -> int:
        return self._records

    async def put(self, item: T, records: int) -> None:
        """Queue ``item`` (worth ``records`` rows); waits while the queue is full."""
        while self._records >= self.limit:
            self._room.clear()
            await self._room.wait()
        if not self._items:
            self._oldest = time.monotonic()
        self._items.append(item)
        self._records += max(records, 1)
        self._ready.set()

    def _due(self) -> bool:
        return bool(self._items) and (self._records >= self.batch
                                      or time.monotonic() >= self._oldest + self.within_s)

    async def take(self) -> list[T]:
        """Everything waiting, once a batch is full or its oldest item has
        waited ``within_s``."""
        while not self._due():
            self._ready.clear()
            timeout = self._oldest + self.within_s - time.monotonic() if self._items else None
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        items, self._items, self._records = self._items, [], 0
        self._room.set()
        return items
