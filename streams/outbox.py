# SPDX-License-Identifier: Apache-2.0
"""What the worker publishes (alerts, attributions, dead letters), sent
again when the broker refuses it.

Faust's ``topic.send`` only buffers: the broker's answer comes later, on a
future nobody awaits ("exception was never retrieved"). So a refusal would
drop the message silently; a restarted broker answers UnknownError for a
moment, until the producer's metadata catches up. Every record published is
also stored in ClickHouse, but a consumer of the alert topic would miss the
alert. So each send is watched and, if refused, sent again with a growing
pause, for up to ``give_up_s``. Past that, or past ``max_pending_bytes``
waiting, it is counted and logged as given up (one line per topic every
10 s, with a count). Retries live in memory: a worker that stops drops the
ones pending (they are stored). Sent again means possibly twice and out of
order; records carry their (host, boot_id, seq), so a consumer can tell.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Counter

log = logging.getLogger("jitterscope.streams")

RESENT = Counter("jitterscope_streams_publish_retries_total",
                 "messages sent again after the broker refused them", ["topic"])
GIVEN_UP = Counter("jitterscope_streams_publish_given_up_total",
                   "messages the broker kept refusing past the retry window (they are stored in ClickHouse)",
                   ["topic"])

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0
LOG_EVERY_S = 10.0  # a long outage refuses every send: one line per topic this often, with the count


class Outbox:
    def __init__(self, give_up_s: float = 300.0, max_pending_bytes: int = 64 << 20):
        self.give_up_s = give_up_s
        self.max_pending_bytes = max_pending_bytes  # memory bound while the broker refuses everything
        self._retries: set[asyncio.Future] = set()  # strong refs: the loop keeps only weak ones to tasks
        self._pending_bytes = 0
        self._unlogged: dict[tuple[str, int], int] = {}
        self._logged_at: dict[tuple[str, int], float] = {}

    @property
    def pending(self) -> int:
        """Messages refused and waiting to be sent again."""
        return len(self._retries)

    async def send(self, topic, key: bytes, value: bytes) -> None:
        """Hand the message to the producer; never raises for the broker's
        sake (the caller goes on to store what it publishes)."""
        await self._attempt(topic, key, value, time.monotonic(), FIRST_PAUSE_S)

    async def _attempt(self, topic, key: bytes, value: bytes, since: float, pause: float) -> None:
        # topic.send would hand back the producer's future; the broker's
        # refusal lands on Faust's own FutureMessage, which only this holds
        message = topic.as_future_message(key=key, value=value)
        try:
            await topic.publish_message(message)
        except Exception as error:  # refused before it left: no metadata, producer stopping
            message = _failed(error)
        message.add_done_callback(lambda done: self._answered(done, topic, key, value, since, pause))

    def _answered(self, done: asyncio.Future, topic, key: bytes, value: bytes, since: float, pause: float) -> None:
        if done.cancelled() or (error := done.exception()) is None:  # exception() also marks it retrieved
            return
        name = topic.get_topic_name()
        if time.monotonic() - since + pause > self.give_up_s:
            GIVEN_UP.labels(name).inc()
            self._say(logging.ERROR, name, f"gave up sending to {name} after {self.give_up_s:.0f} s of refusals "
                      f"({error}); the records are stored in ClickHouse. Check the broker and the topic")
            return
        size = len(key) + len(value)
        if self._pending_bytes + size > self.max_pending_bytes:
            GIVEN_UP.labels(name).inc()
            self._say(logging.ERROR, name, f"gave up sending to {name} ({error}): {self.max_pending_bytes >> 20} "
                      "MiB already wait to be sent again; the records are stored in ClickHouse")
            return
        RESENT.labels(name).inc()
        self._say(logging.WARNING, name, f"the broker refused a message to {name} ({error}); sending it again "
                  f"in {pause:.1f} s, then less often, for up to {self.give_up_s:.0f} s")
        retry = asyncio.ensure_future(self._later(topic, key, value, since, pause))
        self._retries.add(retry)
        self._pending_bytes += size
        retry.add_done_callback(lambda _: self._retried(retry, size))

    def _retried(self, retry: asyncio.Future, size: int) -> None:
        self._retries.discard(retry)
        self._pending_bytes -= size

    async def _later(self, topic, key: bytes, value: bytes, since: float, pause: float) -> None:
        await asyncio.sleep(pause)
        await self._attempt(topic, key, value, since, min(2 * pause, MAX_PAUSE_S))

    def _say(self, level: int, topic: str, text: str) -> None:
        """At most one line per topic and level every LOG_EVERY_S, counting the rest."""
        key, now = (topic, level), time.monotonic()
        self._unlogged[key] = self._unlogged.get(key, 0) + 1
        if now - self._logged_at.get(key, -LOG_EVERY_S) >= LOG_EVERY_S:
            count, self._unlogged[key], self._logged_at[key] = self._unlogged[key], 0, now
            log.log(level, "%s%s", text, f" ({count} such since the last line)" if count > 1 else "")


def _failed(error: BaseException) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
