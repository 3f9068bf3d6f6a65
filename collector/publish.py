"""Batching records into Kafka messages and publishing them.

One message = up to ``max_records`` records of one type from one host, as
NDJSON, keyed by host. A batch is sent when full or when its oldest record is
``max_delay_ns`` old, whichever comes first. Producer discipline after
quix-streams: poll(0) after each produce, retry on a full local queue, count
delivery errors, flush only at shutdown.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from jitterscope import errors
from jitterscope.schemas.events import Record, encode_batch
from jitterscope.schemas.topics import TOPIC_OF


@dataclass
class _Pending:
    records: list[Record] = field(default_factory=list)
    first_at_ns: int = 0


class Batcher:
    """Pure batching policy: collects records per topic, hands out full or
    aged batches. No I/O, so its rules are unit-tested directly."""

    def __init__(self, max_records: int = 500, max_delay_ns: int = 200_000_000,
                 now: Callable[[], int] = time.monotonic_ns):
        self.max_records = max_records
        self.max_delay_ns = max_delay_ns
        self._now = now
        self._pending: dict[str, _Pending] = {}

    def add(self, record: Record) -> list[tuple[str, list[Record]]]:
        """Queue a record; returns the batches that are now full."""
        topic = TOPIC_OF[type(record)]
        pending = self._pending.setdefault(topic, _Pending())
        if not pending.records:
            pending.first_at_ns = self._now()
        pending.records.append(record)
        if len(pending.records) >= self.max_records:
            return [(topic, self._take(topic))]
        return []

    def due(self) -> list[tuple[str, list[Record]]]:
        """Batches whose oldest record has waited max_delay_ns."""
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


class KafkaPublisher:
    """confluent-kafka producer for batches, keyed by host."""

    def __init__(self, bootstrap_servers: str, host: str, extra_config: dict | None = None):
        from confluent_kafka import Producer

        self.host_key = host.encode()
        self.records_sent = 0
        self.delivery_errors = 0
        self.last_error: str | None = None
        config = {
            "bootstrap.servers": bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "client.id": f"jitterscope-collector-{host}",
        }
        config.update(extra_config or {})
        self._producer = Producer(config)

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        try:
            self._producer.list_topics(timeout=timeout_s)
        except Exception as exc:
            raise errors.BrokerUnavailable(
                f"Kafka at {self._bootstrap()} did not answer in {timeout_s:.0f}s ({exc}); "
                "start it, or drop --bootstrap-servers to use the embedded broker"
            ) from exc

    def _bootstrap(self) -> str:
        return str(self._producer)

    def send(self, topic: str, records: list[Record]) -> None:
        payload = encode_batch(records)
        count = len(records)

        def delivered(err, _msg):
            if err is None:
                self.records_sent += count
            else:
                self.delivery_errors += 1
                self.last_error = str(err)

        while True:
            try:
                self._producer.produce(topic, payload, key=self.host_key, on_delivery=delivered)
                break
            except BufferError:
                # local queue full: serve delivery reports to make room, then retry
                self._producer.poll(0.1)
        self._producer.poll(0)

    def poll(self, timeout_s: float = 0) -> None:
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Returns how many messages are still undelivered."""
        return self._producer.flush(timeout_s)
