# SPDX-License-Identifier: Apache-2.0
"""Batching records into Kafka messages and publishing them.

One message = up to ``max_records`` records of one type from one host, as
NDJSON, keyed by host. A batch is sent when full or when its oldest record is
``max_delay_ns`` old, whichever comes first, and is cut below
``kafka_max_message_bytes`` (brokers refuse messages over ~1 MB). Producer
discipline after quix-streams: poll(0) after each produce, count delivery
errors, flush only at shutdown -- and never block the collector's loop: what
Kafka cannot take now waits in the on-disk spool (collector/spool.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import KafkaException, Producer

from jitterscope.common import errors
from jitterscope.collector.metrics import BATCH_AGE
from jitterscope.collector.spool import Batch, Spool
from jitterscope.common.logs import fields
from jitterscope.schemas import events
from jitterscope.schemas.events import Record
from jitterscope.schemas.batches import encode_batch, split_lines
from jitterscope.schemas.topics import TOPIC_OF

log = logging.getLogger("jitterscope.collector.publish")


@dataclass
class _Pending:
    records: list[Record] = field(default_factory=list)
    first_at_ns: int = 0


def urgent_wait_ns(settings) -> int:
    """The run-queue wait the worker will alert on (``runq_alert_ms``), which
    the collector hurries along when ``batch_alerts_at_once`` is on; 0 off."""
    return int(settings.runq_alert_ms * 1_000_000) if settings.batch_alerts_at_once else 0


def alert_worthy(settings) -> Callable[[Record], bool] | None:
    """The Batcher's ``urgent``: a run-queue wait of ``urgent_wait_ns``."""
    if not (alert_ns := urgent_wait_ns(settings)):
        return None
    return lambda record: type(record) is events.RunqEvent and record.wait_ns >= alert_ns


class Batcher:
    """Pure batching policy: collects records per topic, hands out full or
    aged batches. No I/O, so its rules are unit-tested directly."""

    def __init__(self, max_records: int = 500, max_delay_ns: int = 200_000_000,
                 now: Callable[[], int] = time.monotonic_ns, urgent: Callable[[Record], bool] | None = None):
        """``urgent(record)``: a record whose alert should not wait for the
        batch delay (a long run-queue wait); it makes every pending batch due."""
        self.max_records = max_records
        self.max_delay_ns = max_delay_ns
        self._now = now
        self._urgent = urgent
        self._urgent_topics: set[str] = set()
        self._pending: dict[str, _Pending] = {}

    def add(self, record: Record) -> list[tuple[str, list[Record]]]:
        """Queue a record; returns the batches that are now full."""
        topic = TOPIC_OF[type(record)]
        pending = self._pending.setdefault(topic, _Pending())
        if not pending.records:
            pending.first_at_ns = self._now()
        pending.records.append(record)
        if self._urgent and self._urgent(record):
            self._urgent_topics.add(topic)
        if len(pending.records) >= self.max_records:
            self._urgent_topics.discard(topic)
            return [(topic, self._take(topic))]
        return []

    def due(self) -> list[tuple[str, list[Record]]]:
        """Batches whose oldest record has waited max_delay_ns; all of them
        after an urgent record, its topic's last (what its alert needs --
        the process record, the stacks -- goes first)."""
        if self._urgent_topics:
            urgent, self._urgent_topics = self._urgent_topics, set()
            batches = self.drain()
            return [b for b in batches if b[0] not in urgent] + [b for b in batches if b[0] in urgent]
        now = self._now()
        return [
            (topic, self._take(topic))
            for topic, p in list(self._pending.items())
            if p.records and now - p.first_at_ns >= self.max_delay_ns
        ]

    def drain(self) -> list[tuple[str, list[Record]]]:
        return [(topic, self._take(topic)) for topic, p in list(self._pending.items()) if p.records]

    def next_deadline_ns(self) -> int | None:
        firsts = [p.first_at_ns for p in self._pending.values() if p.records]
        return min(firsts) + self.max_delay_ns if firsts else None

    def _take(self, topic: str) -> list[Record]:
        pending = self._pending[topic]
        records, pending.records = pending.records, []
        return records


class RateLimitedLog:
    """At most one line per ``key`` every ``interval_s``; the next line says
    how many were held back. For events that can repeat thousands of times a
    second (delivery errors, drops, an unreachable broker)."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 now: Callable[[], float] = time.monotonic):
        self._log, self._interval, self._now = logger, interval_s, now
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, level: int, key: str, message: str, **extra) -> bool:
        now = self._now()
        if key in self._last and now - self._last[key] < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            extra["similar_since_last"] = held
        self._log.log(level, message, extra=fields(**extra))
        return True


#: delivery errors that no retry can fix: the batch is given up (counted), never spooled
PERMANENT_ERRORS = frozenset({
    "MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "INVALID_RECORD", "CORRUPT_MESSAGE", "_INVALID_ARG",
    "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "_INVALID_TYPE", "UNSUPPORTED_VERSION",
})


def is_permanent(error_name: str) -> bool:
    return error_name in PERMANENT_ERRORS


class StallWatch:
    """Decides when a producer has stopped making progress: messages are
    waiting and none was acknowledged for ``stall_s``. librdkafka can loop
    silently (an idempotent producer whose broker lost its state retries
    UNKNOWN_PRODUCER_ID / epoch bumps forever, logging at debug level only),
    so only progress tells. After a restart without progress the wait doubles
    (up to ``max_s``), so a long outage costs a few restarts, not one a minute."""

    def __init__(self, stall_s: float = 30.0, max_s: float = 300.0):
        self.base_s, self.max_s = stall_s, max_s
        self.wait_s = stall_s
        self.since: float | None = None  # last progress, or when waiting began

    def progress(self, now: float) -> None:
        self.since = now
        self.wait_s = self.base_s

    def stalled(self, now: float, waiting: bool) -> bool:
        if not waiting:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.wait_s

    def restarted(self, now: float) -> None:
        self.since = now
        self.wait_s = min(self.wait_s * 2, self.max_s)


def is_embedded_broker(cluster_id: str | None) -> bool:
    """Tansu (the embedded broker) names its cluster 'tansu_cluster'. It keeps
    no producer state across a restart, so an idempotent producer never
    recovers from one (UNKNOWN_PRODUCER_ID loops); real Kafka keeps it."""
    return bool(cluster_id) and cluster_id.lower().startswith("tansu")


class KafkaPublisher:
    """confluent-kafka producer for batches, keyed by host, that survives the
    broker: every message it has not seen acknowledged is kept (in memory up
    to ``max_inflight_bytes``, then in the on-disk spool) and produced again
    after a delivery error, a fatal producer error or a stall, by a new
    producer where the old one cannot go on. Re-sending may duplicate; the
    sink is idempotent on (host, boot_id, seq), and ``sent_by_topic`` counts a
    record once, when the message holding it is first acknowledged.

    ``idempotence``: True/False, or None = on unless the broker is the
    embedded one (decided by ``check_reachable``)."""

    def __init__(self, bootstrap_servers: str, host: str, extra_config: dict | None = None, *,
                 idempotence: bool | None = None, max_message_bytes: int = 900_000,
                 max_records: int | None = None, spool: Spool | None = None,
                 max_inflight_bytes: int = 32 << 20, stall_s: float = 30.0,
                 now: Callable[[], float] = time.monotonic):
        self.host_key = host.encode()
        self.bootstrap_servers = bootstrap_servers
        self.records_sent = 0
        self.sent_by_topic: dict[str, int] = {}
        self.delivery_errors = 0  # messages that failed delivery (spooled or given up)
        self.given_up = 0  # records no retry can deliver (permanent errors, oversized records)
        self.unspooled_drops = 0  # records Kafka could not take while the spool was off
        self.producer_restarts = 0
        self.last_error: str | None = None
        self.max_message_bytes = max_message_bytes
        self.max_records = max_records
        self.spool = spool
        self.max_inflight_bytes = max_inflight_bytes
        self._idempotence = idempotence
        self._extra = dict(extra_config or {})
        self._now = now
        self._inflight: dict[int, Batch] = {}  # not acknowledged yet, in produce order
        self._inflight_bytes = 0
        self._next_id = 0
        self._fatal: str | None = None
        self._stall = StallWatch(stall_s)
        self._say = RateLimitedLog(log)
        self._producer = self._make_producer()

    # -- the producer ------------------------------------------------------
    def _config(self) -> dict:
        config = {
            "bootstrap.servers": self.bootstrap_servers,
            "acks": "all",
            # auto starts without: nothing is produced before check_reachable decides
            "enable.idempotence": bool(self._idempotence),
            "compression.type": "lz4",
            "linger.ms": 5,
            "message.timeout.ms": 120_000,  # then the batch goes to the spool
            "message.max.bytes": max(1_000_000, self.max_message_bytes + 100_000),
            "queue.buffering.max.kbytes": max(1024, 2 * self.max_inflight_bytes >> 10),
            # a restarted broker is found within a second, not the default 10 s backoff
            "reconnect.backoff.max.ms": 1000,
            "client.id": f"jitterscope-collector-{self.host_key.decode()}",
            "error_cb": self._on_error,
            "logger": _KafkaLog(self._say),
        }
        config.update(self._extra)
        return config

    def _make_producer(self):
        return Producer(self._config())

    def _on_error(self, err) -> None:
        """librdkafka's error_cb (served from poll): fatal errors end this
        producer; the rest (broker down, transport) it retries by itself."""
        if err.fatal():
            self._fatal = f"{err.name()}: {err.str()}"
        else:
            self._say(logging.WARNING, "kafka-error", "Kafka client error (retrying)",
                      error=f"{err.name()}: {err.str()}", bootstrap_servers=self.bootstrap_servers)

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        timeout_s = max(timeout_s, 0.5)  # a --duration shorter than this still gets one answer
        try:
            metadata = self._producer.list_topics(timeout=timeout_s)
        except Exception as exc:
            raise errors.BrokerUnavailable(
                f"Kafka at {self.bootstrap_servers} did not answer in {timeout_s:.0f}s ({exc}); "
                "start it, or drop --bootstrap-servers to use the embedded broker"
            ) from exc
        if self._idempotence is None:
            self._idempotence = not is_embedded_broker(metadata.cluster_id)
            log.info("Kafka producer idempotence decided", extra=fields(
                idempotence=self._idempotence, cluster_id=metadata.cluster_id))
            if self._idempotence:
                self._producer = self._make_producer()

    def restart(self, reason: str) -> None:
        """A new producer; every unacknowledged message is produced again by it."""
        self.producer_restarts += 1
        self._say(logging.WARNING, "restart", "Kafka producer recreated; re-sending what was not acknowledged",
                  reason=reason, restarts=self.producer_restarts, messages=len(self._inflight))
        old, pending = self._producer, list(self._inflight.values())
        self._inflight.clear()
        self._inflight_bytes = 0
        self._fatal = None
        try:  # its late reports find nothing in _inflight and are ignored
            old.purge(in_queue=True, in_flight=True, blocking=False)
            old.poll(0)
        except Exception:
            pass
        self._producer = self._make_producer()
        for batch in pending:
            self._submit(batch)

    # -- sending -----------------------------------------------------------
    def send(self, topic: str, records: list[Record]) -> None:
        if records:
            BATCH_AGE.labels(topic).observe(max(0, time.time_ns() - min(r.ts_ns for r in records)) / 1e9)
        for payload, count in split_lines(encode_batch(records), self.max_message_bytes, self.max_records):
            self._submit(Batch(topic, payload, count))

    def _submit(self, batch: Batch) -> None:
        if len(batch.payload) > self.max_message_bytes:  # one record over the limit: no split helps
            self._give_up(batch, f"one record of {len(batch.payload)} bytes > kafka_max_message_bytes")
            return
        # the spool holds older batches: newer ones queue behind them, in order
        over_budget = self._inflight and self._inflight_bytes + len(batch.payload) > self.max_inflight_bytes
        if (self.spool and batch.segment is None) or over_budget:
            self._to_spool(batch)
            return
        msg_id = self._next_id
        self._next_id += 1
        try:
            self._producer.produce(batch.topic, batch.payload, key=self.host_key,
                                   on_delivery=lambda err, _msg: self._delivered(msg_id, err))
        except BufferError:  # librdkafka's queue is full
            self._to_spool(batch)
            return
        except KafkaException as exc:  # the producer is dead (fatal error): the next poll replaces it
            self._fatal = self._fatal or str(exc)
        # kept until acknowledged: a restart produces it again
        self._inflight[msg_id] = batch
        self._inflight_bytes += len(batch.payload)

    def _delivered(self, msg_id: int, err) -> None:
        batch = self._inflight.pop(msg_id, None)
        if batch is None:
            return  # a report of a producer that was replaced; its message was produced again
        self._inflight_bytes -= len(batch.payload)
        if err is None:
            self.records_sent += batch.count
            self.sent_by_topic[batch.topic] = self.sent_by_topic.get(batch.topic, 0) + batch.count
            self._stall.progress(self._now())
            if batch.segment is not None and self.spool is not None:
                self.spool.settle(batch)
            return
        self.delivery_errors += 1
        self.last_error = f"{err.name()}: {err.str()}"
        if is_permanent(err.name()):
            self._give_up(batch, self.last_error)
        else:
            self._say(logging.WARNING, "delivery", "Kafka delivery failed; batch kept for re-sending",
                      error=self.last_error, delivery_errors=self.delivery_errors)
            self._to_spool(batch)

    def _to_spool(self, batch: Batch) -> None:
        """Out of memory budget, or failed: the batch waits on disk. Without a
        spool, or with a full one, its records are dropped and counted."""
        replayed = batch.segment is not None
        if self.spool is not None and self.spool.append(batch.topic, batch.payload, batch.count):
            pass
        elif self.spool is not None:
            self._say(logging.ERROR, "spool-full", "spool full: records dropped",
                      topic=batch.topic, spool_drops=self.spool.drops, spool_bytes=self.spool.bytes)
        else:
            self.unspooled_drops += batch.count
            self._say(logging.ERROR, "spool-off", "Kafka cannot take records and the spool is off: records dropped",
                      topic=batch.topic, spool_drops=self.spool_drops)
        if replayed and self.spool is not None:
            self.spool.settle(batch)  # it is on the tail of the spool now, or counted as dropped

    def _give_up(self, batch: Batch, reason: str) -> None:
        self.given_up += batch.count
        self._say(logging.ERROR, "give-up", "batch cannot be delivered: records dropped",
                  topic=batch.topic, records=batch.count, reason=reason, given_up=self.given_up)
        if batch.segment is not None and self.spool is not None:
            self.spool.settle(batch)

    # -- counters ----------------------------------------------------------
    @property
    def spool_drops(self) -> int:
        """Records dropped because Kafka could not take them and the spool
        was full (or off); torn spool lines included."""
        return self.unspooled_drops + (self.spool.drops if self.spool else 0)

    @property
    def spooled(self) -> int:
        return self.spool.records if self.spool else 0

    @property
    def undelivered(self) -> int:
        """Records that will never reach Kafka from this run or a later one."""
        return self.spool_drops + self.given_up

    # -- the loop ----------------------------------------------------------
    def poll(self, timeout_s: float = 0) -> None:
        """Serve delivery reports, replace a dead or stuck producer, and
        replay the spool while there is room in flight."""
        try:
            self._producer.poll(timeout_s)
        except KafkaException as exc:  # a fatal error can surface here too: replace the producer below
            self._fatal = self._fatal or str(exc)
        now = self._now()
        if self._fatal:
            self.restart(f"fatal producer error {self._fatal}")
            self._stall.restarted(now)
        elif self._stall.stalled(now, bool(self._inflight)):
            self.restart(f"no delivery acknowledged for {self._stall.wait_s:.0f}s")
            self._stall.restarted(now)
        self._replay()

    def _replay(self) -> None:
        # One segment per poll, and only while under a quarter of the budget:
        # while Kafka is still down, one segment waits in flight and the rest
        # stays on disk (and a batch that goes straight back cannot spin here).
        if self.spool and self._inflight_bytes < self.max_inflight_bytes // 4:
            for batch in self.spool.take(self.max_message_bytes, self.max_records or 1_000_000):
                self._submit(batch)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Deliver what is in flight and in the spool, for up to timeout_s;
        what is still in flight then goes to the spool for the next run.
        Returns how many messages were left undelivered."""
        deadline = self._now() + timeout_s
        while (self._inflight or self.spool) and self._now() < deadline:
            self.poll(0.1)
        left = len(self._inflight)
        for batch in list(self._inflight.values()):
            self._to_spool(batch)
        self._inflight.clear()
        self._inflight_bytes = 0
        try:
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.poll(0)
        except Exception:
            pass
        return left

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


def client_logger(interval_s: float = 60.0) -> logging.Logger:
    """A ``logger`` for any confluent-kafka client's config (producer,
    AdminClient): without one librdkafka prints every failed connect to
    stderr itself, ~20 lines a second while a broker is down."""
    return _KafkaLog(RateLimitedLog(log, interval_s))


class _KafkaLog(logging.Logger):
    """librdkafka's own log lines (connection refused, every retry) rate
    limited: an unreachable broker gives a line a minute, not a flood."""

    def __init__(self, say: RateLimitedLog):
        super().__init__("jitterscope.collector.kafka")
        self._say = say

    def log(self, level, msg, *args, **kwargs):  # librdkafka calls logger.log(level, fmt, *args)
        text = msg % args if args else msg
        self._say(level if level >= logging.WARNING else logging.DEBUG,
                  f"librdkafka-{level}", "Kafka client", detail=text)
