# SPDX-License-Identifier: Apache-2.0
"""The streams pipeline in stages: what each stage reads, its consumer group,
and the judge's way back to what it knew.

Judging (the latency path), attribution (heavy, per request) and storing
(batch I/O) stall each other on one event loop: an attribution tick or a
ClickHouse insert held run-queue alerts seconds behind their waits. So a
streams process runs one ``streams_stage``:

- ``judge``: the alert rules. It reads every input topic a rule judges or the
  host state learns from (``judge_topics``), raises, groups and announces
  alerts (alerts topic, notifications), and publishes every alert row,
  folded ones included, to ``topics.ALERT_ROWS``. It never opens ClickHouse
  (chDB admits one process per data directory: the store's) and never
  attributes. Nothing else runs on its loop.
- ``attribute``: requests joined with the kernel evidence
  (streams/attribution_stage.py). It publishes attributions to
  ``topics.ATTRIBUTION`` and its ``request_slo`` alert rows to
  ``topics.ALERT_ROWS``; it never opens ClickHouse either.
- ``store``: stores every input topic, the alert rows and the
  attributions, and answers /query.
- ``attribute-store``: the attribution and the store in one process (what
  `up` runs beside the judge on one host: a third process decoding every
  record again cost the demo's CPU more than the split saved; its group is
  the store's).
- ``all``: everything in one process, as before the split (the default: a
  fleet's existing workers and their committed offsets keep working).

Each stage is its own Faust app id, so its own consumer group on the same
host-keyed topics (``APP_IDS``): each reads every record, and each scales by
adding processes. `up` runs a judge and an ``attribute-store``.

**The judge's state after a restart or a rebalance.** The single worker
primes its host state from ClickHouse; the judge has none. On taking a
partition of a topic it learns from (topology, processes, device traffic),
it re-reads that partition from ``judge_replay_s`` back (by timestamp; the
beginning where the broker cannot say) up to its group's committed offset,
learning only (``replay``): judging those records again would
announce their alerts twice. Collectors re-send topology and process records
every minute, so a window of minutes is the whole state. Chosen over a
changelog topic: no compaction on Tansu, and a second copy of records the
input topics already hold. The judge's agents wait until the re-read is done
(Faust resumes the streams before its assignment hook ends), so a wait is
never parked for a record the topics already held (streams/handlers.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Iterable

from prometheus_client import Histogram

from jitterscope.schemas import batches, events, topics
from jitterscope.streams.handlers import EVIDENCE

log = logging.getLogger("jitterscope.streams")

STAGES = ("all", "judge", "attribute", "store", "attribute-store")
#: stage -> Faust app id = Kafka consumer group ("all" keeps the single worker's, and so its offsets)
APP_IDS = {"all": "jitterscope-streams", "judge": "jitterscope-judge", "attribute": "jitterscope-attribute",
           "store": "jitterscope-store", "attribute-store": "jitterscope-store"}
#: the stages that open the store (chDB admits one process per data directory), and those that store
#: their own attributions (the others publish them for the store stage)
STORING = frozenset({"all", "store", "attribute-store"})
ATTRIBUTING_IN_PROCESS = frozenset({"all", "attribute-store"})
#: what each topic a stage reads or re-reads holds
RECORD_OF: dict[str, type[events.Record]] = {
    **topics.INPUT_TOPICS, topics.ALERT_ROWS: events.Alert, topics.ATTRIBUTION: events.RequestAttribution}
#: the record types the host state learns from (HostState.learn)
LEARNED = (events.Topology, events.ProcessInfo, events.DeviceIo)
LEARNED_TOPICS = tuple(t for t, kind in topics.INPUT_TOPICS.items() if kind in LEARNED)

#: how often the loop-lag probe asks to run: short enough to see a stall of an alert's budget (100 ms)
LOOP_LAG_INTERVAL_S = 0.05
LOOP_LAG = Histogram(
    "jitterscope_streams_loop_lag_seconds",
    "how late a periodic task ran on the stage's event loop (ran at minus scheduled at): what every record "
    "waited behind whatever held the loop", ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))

#: producer to stage: what an alert's delay spent before the stage had the record (the rest is the
#: collector's, before it produced, and the stage's own)
MESSAGE_AGE = Histogram(
    "jitterscope_streams_message_age_seconds",
    "how long a message waited between its producer (its Kafka timestamp) and this stage taking it",
    ["stage", "topic"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))


def observe_age(stage: str, topic: str, produced_s: float | None) -> None:
    """A message taken now, produced at ``produced_s`` (epoch s; None: the broker gave no timestamp)."""
    if produced_s:
        MESSAGE_AGE.labels(stage, topic).observe(max(0.0, time.time() - produced_s))


#: input topics with a handler that judges nothing: their records only wait for attribution (the store stage's)
ATTRIBUTION_ONLY = frozenset({topics.REQUESTS, topics.BLOCKED})
#: what the attribution stage reads besides the learned topics: the spans, the kernel evidence they are joined
#: with, and the stacks that evidence names
ATTRIBUTED = frozenset({topics.REQUESTS, topics.STACKS, *EVIDENCE})


def judge_topics(handled: Iterable[str]) -> list[str]:
    """The input topics the judge reads: those a handler judges (``handled``:
    Handlers.table's topics) and those the host state learns from."""
    wanted = set(handled) | set(LEARNED_TOPICS)
    return [t for t in topics.INPUT_TOPICS if t in wanted and t not in ATTRIBUTION_ONLY]


def stage_topics(stage: str, handled: Iterable[str]) -> dict[str, type[events.Record]]:
    """topic -> record type of what a stage's agents read."""
    if stage == "judge":
        return {t: topics.INPUT_TOPICS[t] for t in judge_topics(handled)}
    if stage == "attribute":
        return {t: kind for t, kind in topics.INPUT_TOPICS.items() if t in ATTRIBUTED or t in LEARNED_TOPICS}
    if stage == "store":
        return dict(RECORD_OF)
    if stage == "attribute-store":
        return {**topics.INPUT_TOPICS, topics.ALERT_ROWS: events.Alert}
    return dict(topics.INPUT_TOPICS)


async def measure_loop_lag(stage: str, interval_s: float = LOOP_LAG_INTERVAL_S,
                           clock: Callable[[], float] = time.monotonic, rounds: int | None = None) -> None:
    """Observe, every ``interval_s``, how late this task woke (scheduled at
    vs ran at) into LOOP_LAG{stage}; ``rounds``: stop after so many (tests)."""
    child = LOOP_LAG.labels(stage)
    done = 0
    while rounds is None or done < rounds:
        due = clock() + interval_s
        await asyncio.sleep(interval_s)
        child.observe(max(0.0, clock() - due))
        done += 1


async def replay(make_consumer: Callable[[], Awaitable], partitions: Iterable[tuple[str, int]],
                 since_ms: Callable[[str], int], take: Callable[[str, list[Any]], None],
                 deadline_s: float, upto: str = "committed") -> dict[tuple[str, int], int]:
    """Hand ``take`` the records of ``partitions`` (topic, partition) from
    ``since_ms(topic)`` (epoch ms) up to the group's committed offset
    (``upto="committed"``: the judge, which must not judge those records
    again) or the partition's end as it is now (``"end"``: the attribution
    stage, which then skips what it re-read, ``AttributeStage``).
    ``make_consumer``: a started aiokafka consumer of the stage's group that
    never joins it. Stops at ``deadline_s`` (monotonic) with what it read.
    Returns (topic, partition) -> the offset it read up to."""
    from aiokafka import TopicPartition

    wanted = [TopicPartition(t, p) for t, p in partitions]
    if not wanted:
        return {}
    consumer = await make_consumer()
    try:
        consumer.assign(wanted)
        if upto == "committed":
            ends = {tp: await consumer.committed(tp) for tp in wanted}
            ends = {tp: end for tp, end in ends.items() if end}  # none committed: the agent reads it all anyway
        else:
            ends = await consumer.end_offsets(wanted)
        if not ends:
            return {}
        starts = {}
        for topic in {tp.topic for tp in ends}:
            starts.update(await _offsets_since(consumer, [tp for tp in ends if tp.topic == topic], since_ms(topic)))
        for tp, start in starts.items():
            consumer.seek(tp, start)
        decoders = {t: batches.BatchDecoder(RECORD_OF[t]) for t in {tp.topic for tp in ends}}
        left = {tp for tp in ends if starts[tp] < ends[tp]}
        while left and time.monotonic() < deadline_s:
            fetched = await consumer.getmany(*left, timeout_ms=200, max_records=2000)
            for tp, messages in fetched.items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        left.discard(tp)
                        break
                    good, _bad = decoders[tp.topic].decode(message.value or b"")
                    if good:
                        take(tp.topic, good)
                    if message.offset + 1 >= ends[tp]:
                        left.discard(tp)
        if left:
            log.warning("%d partitions' re-read stopped at its deadline", len(left))
        return {(tp.topic, tp.partition): end for tp, end in ends.items() if tp not in left}
    finally:
        await consumer.stop()


async def _offsets_since(consumer, partitions: list, since_ms: int) -> dict:
    """tp -> first offset at or after ``since_ms``; the partition's beginning
    where the broker does not answer by time, its end where nothing is newer."""
    try:
        by_time = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
    except Exception:  # a broker without timestamp look-ups: the whole partition (bounded by retention)
        by_time = {}
    begin = await consumer.beginning_offsets(partitions)
    end = None
    out = {}
    for tp in partitions:
        found = by_time.get(tp)
        if found is not None:
            out[tp] = max(found.offset, begin[tp])
        elif tp in by_time:  # answered: nothing that recent
            end = end or await consumer.end_offsets(partitions)
            out[tp] = end[tp]
        else:
            out[tp] = begin[tp]
    return out
