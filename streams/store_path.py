# SPDX-License-Identifier: Apache-2.0
"""The streams worker's store path: decoded batches into ClickHouse (through
streams/sink.py), every record stored or dead-lettered before Faust may
commit its offsets.

A batch is written in chunks of sink_batch_rows. A chunk ClickHouse refuses
is bisected down to the single records it refuses: a few bad records cost
O(bad x log n) inserts and the good ones around them are stored. Those
records, and the input that could not be decoded, go to the dead-letter topic
with their reason, partition and offset, and to the deadletter table. An
unreachable ClickHouse is waited for (the sink retries); nothing here raises.
An input topic's records count as accounted (RECORDS_ACCOUNTED) once they
are safe, stored or dead-lettered.

``StorePath`` is mixed into the worker (streams/app.py), which gives it its
settings, its sink, its outbox and the dead-letter topic.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, NamedTuple, Sequence

import msgspec
from prometheus_client import Counter

from jitterscope.common.settings import Settings
from jitterscope.schemas import events, topics
from jitterscope.streams.outbox import Outbox
from jitterscope.streams.sink import ClickHouseSink

log = logging.getLogger("jitterscope.streams")

RECORDS_ACCOUNTED = Counter(
    "jitterscope_streams_records_accounted_total",
    "records of an input topic that are safe: stored in ClickHouse or dead-lettered", ["topic"])
DEAD_LETTERS = Counter("jitterscope_streams_deadletters_total", "input lines sent to the dead-letter topic", ["topic"])


class Decoded(NamedTuple):
    """One Kafka message after decoding: what flows from the per-message
    processor to the batched store step. ``partition``/``offset`` travel with
    it so that a record ClickHouse refuses is dead-lettered with its origin."""

    records: Sequence[events.Record]
    dead: list[events.DeadLetter]
    alerts: list[events.Alert]
    partition: int = 0
    offset: int = 0
    host: str = ""


class StorePath:
    """The worker's store and dead-letter steps (mixed into StreamsWorker)."""

    settings: Settings
    sink: ClickHouseSink
    outbox: Outbox
    deadletter_topic: Any  # a Faust topic

    async def store(self, topic: str, table: str, batch: list["Decoded"]) -> None:
        """Write a batch; returns only when every record is stored or
        dead-lettered, after which Faust may commit its offsets. It never
        raises: a record ClickHouse refuses is found by bisecting the batch
        and dead-lettered with its partition and offset; an unreachable
        ClickHouse is waited for (the offsets stay uncommitted meanwhile)."""
        dead = [letter for d in batch for letter in d.dead]
        step = self.settings.sink_batch_rows
        for name, part in ((table, lambda d: d.records), ("alerts", lambda d: d.alerts)):
            records = list(itertools.chain.from_iterable(map(part, batch)))
            for start in range(0, len(records), step):
                chunk = records[start:start + step]
                try:  # the common case: no per-record bookkeeping unless ClickHouse refuses
                    await self.sink.write(name, chunk)
                except Exception as exc:
                    rows = [(d, record) for d in batch for record in part(d)][start:start + step]
                    dead.extend(await self._store_isolating(topic, name, rows, refused=exc))
        if dead:
            await self.dead_letter(dead)
        # the input topics and the other stages' (streams/stages.py)
        if topic in topics.INPUT_TOPICS or topic in (topics.ALERT_ROWS, topics.ATTRIBUTION):
            RECORDS_ACCOUNTED.labels(topic).inc(sum(len(d.records) for d in batch))

    async def _store_isolating(self, topic: str, table: str, rows: list[tuple["Decoded", events.Record]],
                               refused: Exception | None = None) -> list[events.DeadLetter]:
        """Insert records (each with the message it came in); when ClickHouse
        refuses, insert each half on its own, down to the single records it
        refuses, and return those as dead letters: a few bad records cost
        O(bad x log n) inserts and the good ones around them are stored.
        ``refused``: these rows were just refused (by store()), don't retry them whole."""
        try:
            if refused is not None:
                raise refused
            await self.sink.write(table, [record for _, record in rows])
            return []
        except Exception as exc:
            if len(rows) == 1:
                origin, record = rows[0]
                return [events.DeadLetter(
                    host=origin.host or getattr(record, "host", ""), topic=topic, partition=origin.partition,
                    offset=origin.offset, line=0, reason=f"ClickHouse refused the record for {table}: {exc}"[:2000],
                    payload=msgspec.json.encode(record).decode(), ts_ns=time.time_ns())]
            log.warning("ClickHouse refused %d rows for %s (%s); isolating the bad ones", len(rows), table,
                        str(exc)[:200])
        half = len(rows) // 2
        return [*await self._store_isolating(topic, table, rows[:half]),
                *await self._store_isolating(topic, table, rows[half:])]

    async def dead_letter(self, dead: list[events.DeadLetter]) -> None:
        for letter in dead:
            DEAD_LETTERS.labels(letter.topic).inc()
            log.warning("dead-lettered %s[%d]@%d line %d: %s", letter.topic, letter.partition,
                        letter.offset, letter.line, letter.reason[:300])
            await self.outbox.send(self.deadletter_topic, letter.topic.encode(), msgspec.json.encode(letter))
        try:
            await self.sink.write("deadletter", dead)
        except Exception:  # they are on the dead-letter topic already
            log.exception("could not store %d dead letters in ClickHouse; they are on %s",
                          len(dead), topics.DEADLETTER)
