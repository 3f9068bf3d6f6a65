# SPDX-License-Identifier: Apache-2.0
"""``jitterscope replay``: a recording's frames (collector/recording.py, the
file format) produced back into a pipeline, keys kept.

Replay trusts nothing in the file: it produces only to jitterscope's input
topics, only the frames keyed for the host the user names (``--host``), and
only frames whose every record carries that host (``FrameCheck``): a
recording cannot write another host's records, or anything outside
jitterscope's topics. Records keep their (host, boot_id, seq), so the
idempotent sink stores a recording once however often it is replayed.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from jitterscope.collector.recording import Frame, RecordingReader, Summary, summarize
from jitterscope.common import errors
from jitterscope.schemas import batches, topics

@dataclass
class ReplayResult:
    messages: int = 0
    records: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    truncated: bool = False
    error: str = ""
    #: frames not produced, by why (one sentence each, hostile names quoted
    #: with repr: safe to print); their records in refused_records
    refused: dict[str, int] = field(default_factory=dict)
    refused_records: int = 0


def _quoted(key: bytes) -> str:
    return repr(key.decode(errors="replace"))


def check_host(summary: Summary, host: str | None, path: Path | str) -> str:
    """The host to replay: ``host`` when the recording holds frames keyed
    for it. Raises BadConfig, naming the hosts the file holds, when it is
    not given or not there."""
    held = ", ".join(map(repr, sorted(summary.hosts)))
    if not summary.hosts:
        raise errors.BadConfig(f"{path} holds no records to replay")
    if not host:
        if len(summary.hosts) == 1:
            only = next(iter(summary.hosts))
            shown = only if re.fullmatch(r"[\w.:-]+", only, re.ASCII) else repr(only)
            raise errors.BadConfig(f"replay needs --host: {path} holds the records of host {only!r}; "
                                   f"to replay them, pass --host {shown}")
        raise errors.BadConfig(f"replay needs --host: {path} holds records of {len(summary.hosts)} hosts "
                               f"({held}); name the one to replay with --host HOST")
    if host not in summary.hosts:
        raise errors.BadConfig(f"{path} holds no records of host {host!r}; it holds records of: {held}")
    return host


class FrameCheck:
    """What replay produces: frames for one of jitterscope's input topics,
    keyed for the chosen host, whose records all carry that host (the key
    is the host the pipeline files a message under; a record naming another
    host would overwrite that host's rows). Lines that do not decode are let
    through: the streams worker dead-letters them under the message key."""

    def __init__(self, host: str):
        self.host, self.key = host, host.encode()
        self._decoders = {t: batches.BatchDecoder(rt) for t, rt in topics.INPUT_TOPICS.items()}

    def refusal(self, frame: Frame) -> str | None:
        """Why ``frame`` must not be produced, or None."""
        decoder = self._decoders.get(frame.topic)
        if decoder is None:
            return f"topic {frame.topic!r} is not one of jitterscope's input topics"
        if frame.key != self.key:
            return f"keyed for host {_quoted(frame.key)}, not {self.host!r}"
        good, _bad = decoder.decode(frame.payload)
        others = sorted({r.host for r in good if r.host != self.host})
        if others:
            return (f"keyed for host {self.host!r} but holding records of host "
                    f"{', '.join(map(repr, others[:3]))}{', ...' if len(others) > 3 else ''}")
        return None


def _producer(summary: Summary, bootstrap_servers: str, timeout_s: float, extra_config: dict | None):
    """A producer for replay, once the broker answered and has every topic
    of the recording; raises BrokerUnavailable or BadConfig (see replay)."""
    from confluent_kafka import KafkaException, Producer

    config = {"bootstrap.servers": bootstrap_servers, "acks": "all", "enable.idempotence": False,
              "compression.type": "lz4", "linger.ms": 5, "message.timeout.ms": int(timeout_s * 1000),
              "message.max.bytes": 2_000_000, "client.id": "jitterscope-replay",
              # librdkafka's lines (a refused connection, every retry) go to logging, below WARNING
              "logger": logging.getLogger("jitterscope.collector.replay.kafka")}
    config.update(extra_config or {})
    producer = Producer(config)
    try:
        metadata = producer.list_topics(timeout=10)
    except KafkaException as exc:
        raise errors.BrokerUnavailable(
            f"Kafka at {bootstrap_servers} did not answer ({exc}); start it, or pass the right "
            "--bootstrap-servers") from exc
    # only topics replay may produce to: a hostile name is refused (FrameCheck), not asked for
    missing = sorted(t for t in summary.by_topic if t in topics.INPUT_TOPICS and t not in metadata.topics)
    if missing:
        raise errors.BadConfig(
            f"topics missing on {bootstrap_servers}: {', '.join(missing)}; create them "
            f"({topics.PARTITIONS} partitions each) or rerun with --create-topics")
    return producer


def replay(path: Path | str, bootstrap_servers: str, *, host: str,
           progress: Callable[[ReplayResult], None] | None = None, timeout_s: float = 60.0,
           extra_config: dict | None = None) -> ReplayResult:
    """Produce the frames of a recording that are ``host``'s (see
    FrameCheck), with their key, and wait for all acknowledgements; the
    others are counted in ``refused``, never produced. Raises
    BrokerUnavailable when the broker does not answer, BadConfig when the
    file holds nothing of ``host`` or a topic is missing (and not created)."""
    summary = summarize(path)  # also validates the file before anything is sent
    check_host(summary, host, path)
    check = FrameCheck(host)
    producer = _producer(summary, bootstrap_servers, timeout_s, extra_config)
    result = ReplayResult(truncated=summary.truncated, error=summary.error)
    failures: list[str] = []

    def delivered(err, _msg, topic: str, count: int) -> None:
        if err is not None:
            failures.append(f"{topic}: {err.name()}: {err.str()}")
            return
        result.messages += 1
        result.records += count
        result.by_topic[topic] = result.by_topic.get(topic, 0) + count

    next_progress = time.monotonic() + 1.0
    for frame in RecordingReader(path):
        why = check.refusal(frame)
        if why is not None:
            result.refused[why] = result.refused.get(why, 0) + 1
            result.refused_records += frame.records
            continue
        while True:
            try:
                producer.produce(frame.topic, frame.payload, key=frame.key,
                                 on_delivery=lambda err, msg, t=frame.topic, n=frame.records: delivered(err, msg, t, n))
                break
            except BufferError:  # librdkafka's queue is full: let it drain
                producer.poll(0.1)
        producer.poll(0)
        if progress and time.monotonic() >= next_progress:
            next_progress = time.monotonic() + 1.0
            progress(result)
    left = producer.flush(timeout_s)
    if failures or left:
        raise errors.BrokerUnavailable(
            f"replay incomplete: {len(failures)} messages failed, {left} unacknowledged after {timeout_s:.0f}s"
            + (f" (first: {failures[0]})" if failures else "") + "; replay again: records are stored once")
    return result
