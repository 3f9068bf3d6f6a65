# SPDX-License-Identifier: Apache-2.0
"""`jitterscope topics create|check`: every jitterscope topic, on any Kafka,
with the configured partitions and replication factor (kafka_partitions,
kafka_replication_factor).

`collector` and `streams` call ``require`` before they start: against a
cluster that lacks a topic (or has one with another partition count than the
streams worker's Faust topics would assume) they refuse, with the one
command that fixes it, instead of producing into auto-created topics with the
broker's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitterscope.common import errors, kafka_auth
from jitterscope.schemas import topics


@dataclass(frozen=True)
class TopicState:
    name: str
    partitions: int | None  # None: missing
    replication_factor: int | None

    def problem(self, partitions: int, replication_factor: int) -> str | None:
        if self.partitions is None:
            return "missing"
        if self.partitions != partitions:
            return f"{self.partitions} partitions, kafka_partitions is {partitions}"
        if self.replication_factor is not None and self.replication_factor < replication_factor:
            return f"replication factor {self.replication_factor}, kafka_replication_factor is {replication_factor}"
        return None


def admin(s, timeout_s: float = 15.0):
    from confluent_kafka.admin import AdminClient

    if not s.bootstrap_servers:
        raise errors.BadConfig("no Kafka given: pass --bootstrap-servers (or JITTERSCOPE_BOOTSTRAP_SERVERS)")
    from jitterscope.collector.publish import client_logger

    return AdminClient({"bootstrap.servers": s.bootstrap_servers, "socket.timeout.ms": int(timeout_s * 1000),
                        "logger": client_logger(),  # not librdkafka's line per failed connect
                        **kafka_auth.librdkafka_config(s)})


def describe(s, names=topics.ALL_TOPICS, timeout_s: float = 15.0) -> list[TopicState]:
    """What the cluster has of each topic."""
    from confluent_kafka import KafkaException

    try:
        metadata = admin(s, timeout_s).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise errors.BrokerUnavailable(
            f"Kafka at {s.bootstrap_servers} is unreachable ({exc}); start it or check --bootstrap-servers "
            "and the kafka_security_* settings") from exc
    states = []
    for name in names:
        meta = metadata.topics.get(name)
        if meta is None or meta.error is not None or not meta.partitions:
            states.append(TopicState(name, None, None))
        else:
            replicas = min(len(p.replicas) for p in meta.partitions.values())
            states.append(TopicState(name, len(meta.partitions), replicas))
    return states


def problems(s, states: list[TopicState]) -> dict[str, str]:
    return {t.name: p for t in states if (p := t.problem(s.kafka_partitions, s.kafka_replication_factor))}


def create(s, names=topics.ALL_TOPICS, timeout_s: float = 15.0) -> list[str]:
    """Create the missing topics; returns their names. Existing topics are
    left alone (changing a partition count moves hosts between workers):
    ``check`` reports those that differ."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    missing = [t.name for t in describe(s, names, timeout_s) if t.partitions is None]
    if not missing:
        return []
    new = [NewTopic(n, num_partitions=s.kafka_partitions, replication_factor=s.kafka_replication_factor)
           for n in missing]
    client = admin(s, timeout_s)  # held: the futures die with the client
    for name, future in client.create_topics(new, operation_timeout=timeout_s).items():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):  # another process made it meanwhile
                raise errors.BrokerUnavailable(
                    f"could not create topic {name} ({s.kafka_partitions} partitions, replication factor "
                    f"{s.kafka_replication_factor}): {exc}") from exc
    return missing


def require(s, names=topics.ALL_TOPICS, timeout_s: float = 15.0) -> None:
    """Refuse to start against a cluster whose topics are missing or have
    another partition count than configured: one line, with the fix. A lower
    replication factor is only reported by ``check`` (it does not break the
    pipeline)."""
    states = describe(s, names, timeout_s)
    missing = [t.name for t in states if t.partitions is None]
    if missing:
        raise errors.BadConfig(
            f"{len(missing)} jitterscope topic(s) missing on {s.bootstrap_servers} ({_few(missing)}): run "
            f"jitterscope topics create --bootstrap-servers {s.bootstrap_servers}")
    wrong = {t.name: t.partitions for t in states if t.partitions != s.kafka_partitions}
    if wrong:
        found = sorted(set(wrong.values()))
        raise errors.BadConfig(
            f"topics on {s.bootstrap_servers} have {'/'.join(map(str, found))} partitions, kafka_partitions is "
            f"{s.kafka_partitions} ({_few(sorted(wrong))}): set kafka_partitions={found[0]} to match the "
            "cluster")


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
