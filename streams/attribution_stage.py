# SPDX-License-Identifier: Apache-2.0
"""The attribution stage (``jitterscope streams --stage attribute``,
streams/stages.py): requests joined with the kernel evidence, in a process
of its own that never opens ClickHouse, so that it scales by adding
processes like the judge.

- **What it commits.** Evidence messages are acked as they are read; a
  request message only once every span it brought is attributed and
  published (``HeldRequests``). A process that dies leaves its unattributed
  spans to the partition's next owner, which reads them again.
- **Its state after a rebalance** (``regain``): on taking partitions it
  re-reads, before its agents read on, their host records, the last
  ``evidence_horizon_s`` of kernel evidence up to each partition's end (its
  agents then skip what was re-read: a request read after sees the evidence
  sent before it, as the one process that read the partition all along
  did), and the attributions already published for those hosts: the
  baselines they learned, and spans attributed are not attributed again.
- **What it publishes:** attributions to the attribution topic and the
  ``request_slo`` alert rows to the alert-rows topic; the store stage stores
  both. On stop it attributes what it still held (``attribute_all``): the
  embedded broker keeps nothing for a next start.

``AttributionStage`` is mixed into the worker (streams/app.py), which gives
it its settings, host state, handlers, attributor and ``attribute_due``
(streams/attribution_tick.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable

from jitterscope.schemas import batches, events, topics
from jitterscope.streams import stages

log = logging.getLogger("jitterscope.streams")

SpanKey = tuple[str, str, int]


class HeldRequests:
    """The attribution stage's request messages, held unacked until every
    span they brought is attributed and published: Faust commits only
    offsets acked in a row, so a process that dies leaves its unattributed
    requests to the partition's next owner, which reads them again."""

    def __init__(self) -> None:
        self._messages: dict[int, list] = {}  # message number -> [partition, spans left, ack, its span keys]
        self._by_span: dict[SpanKey, list[int]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._messages)

    def hold(self, partition: int, keys: list[SpanKey], ack: Callable[[], Awaitable]) -> Awaitable | None:
        """Hold a message until ``keys`` (its spans still to attribute) are
        all released; with none left, its ack to await now."""
        if not keys:
            return ack()
        number, self._next = self._next, self._next + 1
        self._messages[number] = [partition, len(keys), ack, keys]
        for key in keys:
            self._by_span.setdefault(key, []).append(number)
        return None

    def release(self, keys: list[SpanKey]) -> list[Awaitable]:
        """The spans ``keys`` were attributed and published: the acks of the
        messages that now have none left to wait for."""
        acks = []
        for key in keys:
            for number in self._by_span.pop(key, ()):
                message = self._messages.get(number)
                if message is None:  # its partition moved away meanwhile
                    continue
                message[1] -= 1
                if message[1] == 0:
                    acks.append(self._messages.pop(number)[2]())
        return acks

    def drop(self, partitions: set[int]) -> None:
        """Forget the messages of partitions this process no longer holds
        (their next owner reads them again; an ack from an old assignment means nothing)."""
        for number in [n for n, m in self._messages.items() if m[0] in partitions]:
            for key in self._messages.pop(number)[3]:
                waiting = self._by_span.get(key, [])
                if number in waiting:
                    waiting.remove(number)
                if not waiting:
                    self._by_span.pop(key, None)


class AttributionStage:
    """The attribution stage's hand-over and reading (mixed into StreamsWorker)."""

    settings: Any
    state: Any
    handlers: Any
    attributor: Any
    held_requests: HeldRequests
    read_until: dict[tuple[str, int], int]
    partition_hosts: dict[int, set[str]]
    catching_up: dict[tuple[str, int], int] = {}  # (topic, partition) -> where it ended when taken (catch_up)
    catch_up_by = 0.0  # monotonic: attribute on after this, caught up or not
    relearned: Any  # asyncio.Event: set once the partitions taken are re-read (streams/app.py)
    receive: Callable[..., Awaitable]  # streams/app.py: decode a message and hand it on
    attribute_due: Callable[[int], Awaitable]  # streams/attribution_tick.py
    _side_consumer: Callable[[], Awaitable]  # streams/app.py

    async def attribute_message(self, stream, event, name: str, decoder: batches.BatchDecoder) -> None:
        """Read one message: feed the attributor, ack evidence at once and a
        request message once its spans are attributed."""
        message = event.message
        if message.offset < self.read_until.get((name, message.partition), -1):
            await stream.ack(event)  # read already: re-read when the partition was taken, or not yet committed
            return
        decoded = await self.receive(name, decoder, event.value, message)
        if decoded.host:
            self.partition_hosts.setdefault(message.partition, set()).add(decoded.host)
        if name != topics.REQUESTS:
            self.read_until[(name, message.partition)] = message.offset + 1
            await stream.ack(event)
            return
        keys = [(r.host, r.boot_id, r.seq) for r in decoded.records if r not in self.attributor.attributed]
        if (ack := self.held_requests.hold(message.partition, keys, lambda: stream.ack(event))) is not None:
            await ack

    async def regain(self, gained) -> None:
        """The attribution stage's state for partitions it just took, from the
        topics (streams/stages.py: replay), within half a session: the host
        records, the kernel evidence of the last ``evidence_horizon_s`` up to
        each partition's end (its agents then skip what was re-read, so
        every request read after sees the evidence sent before), and the
        attributions published for those hosts (baselines, and spans already
        attributed are not attributed again: the attribution topic is keyed
        by the worker's partitioner, so all of its partitions are read)."""
        s = self.settings
        started = time.monotonic()
        deadline = started + s.kafka_session_timeout_s / 2
        now_ms = int(time.time() * 1e3)
        learned_since, evidence_since = now_ms - int(s.judge_replay_s * 1e3), now_ms - int(s.evidence_horizon_s * 1e3)
        hosts: set[str] = set()

        def take(topic: str, records: list[events.Record]) -> None:
            hosts.update(r.host for r in records)
            if isinstance(records[0], stages.LEARNED):
                for record in records:
                    self.state.learn(record)
            else:
                self.handlers.feed(topic, records)

        def remember(_topic: str, done: list[events.RequestAttribution]) -> None:
            for attribution in done:
                if attribution.host in hosts:
                    self.attributor.remember(attribution)

        try:
            wanted = [(tp.topic, tp.partition) for tp in gained if tp.topic != topics.REQUESTS]
            self.read_until.update(await stages.replay(
                self._side_consumer, wanted, lambda t: learned_since if t in stages.LEARNED_TOPICS else evidence_since,
                take, deadline, upto="end"))
            await stages.replay(self._side_consumer, [(topics.ATTRIBUTION, p) for p in range(s.kafka_partitions)],
                                lambda _t: evidence_since, remember, deadline, upto="end")
            log.info("attribution: %d hosts known again in %.2f s", len(hosts), time.monotonic() - started)
        except Exception:  # attribute on with what arrives: the evidence window refills within the horizon
            log.exception("attribution: could not re-read the partitions it took")

    async def catch_up(self, assigned) -> None:
        """After any assignment: note where each assigned partition (but the
        requests') ends now. Attribution waits until the agents have read
        that far (``attribute_when_caught_up``): a rebalance stalls them, and
        the messages they held are read again, so requests that came due
        meanwhile would miss evidence the topics already held."""
        wanted = [tp for tp in assigned if tp.topic != topics.REQUESTS]
        consumer = await self._side_consumer()
        try:
            ends = await consumer.end_offsets(wanted) if wanted else {}
        except Exception:  # attribute on: the grace period covers an ordinary lag
            log.exception("attribution: could not read where its partitions end")
            ends = {}
        finally:
            await consumer.stop()
        self.catching_up = {(tp.topic, tp.partition): end for tp, end in ends.items() if end}
        self.catch_up_by = time.monotonic() + self.settings.kafka_session_timeout_s

    async def attribute_when_caught_up(self) -> None:
        """The attribution tick of the stage: only once its agents read what
        the topics held when it took its partitions (or after a session's
        wait, with what they read)."""
        if not self.relearned.is_set():
            return
        self.catching_up = {k: end for k, end in self.catching_up.items() if self.read_until.get(k, 0) < end}
        if self.catching_up and time.monotonic() < self.catch_up_by:
            return
        await self.attribute_due(time.time_ns())

    def let_go(self, partitions: set[int]) -> None:
        """The attribution stage lost ``partitions``: their next owner
        attributes their held requests (never acked, so read again)."""
        self.held_requests.drop(partitions)
        self.attributor.forget_hosts(set().union(*(self.partition_hosts.pop(p, set()) for p in partitions)))
        for key in [k for k in self.read_until if k[1] in partitions]:
            del self.read_until[key]

    async def attribute_all(self) -> None:
        """On stop: attribute every request held, with the evidence there is,
        rather than leave it to a next start that may never read it again
        (the embedded broker keeps nothing)."""
        try:
            await self.attribute_due(2 ** 62)
        except Exception:
            log.exception("could not attribute the held requests on stop")

