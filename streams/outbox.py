"""What the worker publishes (alerts, attributions, dead letters), sent
again when the broker refuses it.

Faust's ``topic.send`` only buffers: the broker's answer comes later, on a
future nobody awaits ("exception was never retrieved"), so a refusal (a restarted broker whose metadata the
producer has not caught up with answers UnknownError for a moment) would
drop the message silently. Every record published is also stored in
ClickHouse, but a consumer of the alert topic would miss the alert. So each
send is watched and, if refused, sent again with a growing pause, for up to
``give_up_s``; past that it is counted and logged as given up. Retries live
in memory: a worker that stops drops the ones pending (they are stored).
Sent again means possibly twice and out of order; records carry their
(host, boot_id, seq), so a consumer can tell.
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


class Outbox:
    def __init__(self, give_up_s: float = 300.0):
        self.give_up_s = give_up_s
        self._retries: set[asyncio.Future] = set()  # strong refs: the loop keeps only weak ones to tasks

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
            log.error("gave up sending a message to %s after %.0f s of refusals (%s); its records are stored in "
                      "ClickHouse. Check the broker and the topic.", name, time.monotonic() - since, error)
            return
        RESENT.labels(name).inc()
        log.warning("the broker refused a message to %s (%s); sending it again in %.1f s", name, error, pause)
        retry = asyncio.ensure_future(self._later(topic, key, value, since, pause))
        self._retries.add(retry)
        retry.add_done_callback(self._retries.discard)

    async def _later(self, topic, key: bytes, value: bytes, since: float, pause: float) -> None:
        await asyncio.sleep(pause)
        await self._attempt(topic, key, value, since, min(2 * pause, MAX_PAUSE_S))


def _failed(error: BaseException) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
