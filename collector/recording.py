"""Record and replay: the collector's Kafka messages in a file, and back.

``jitterscope record`` runs the collector with :class:`RecordingPublisher`
instead of ``KafkaPublisher``: the same NDJSON batches (cut by the same
``split_lines`` rule, so each fits a Kafka message), each with its topic and
key (the host). ``jitterscope replay`` produces them, keys kept, into a
pipeline; records keep their (host, boot_id, seq), so the idempotent sink
stores a recording once however often it is replayed.

File format (version 1)
-----------------------
The file is a sequence of concatenated gzip members (RFC 1952; ``zcat FILE``
prints it whole). Decompressed, it is::

    jitterscope-recording 1\\n                        (once, first)
    TOPIC \\t KEY \\t RECORDS \\t LENGTH \\n PAYLOAD      (one frame a message)

``KEY`` is the message key (the host name, no tab or newline), ``RECORDS``
the number of NDJSON lines in ``PAYLOAD``, ``LENGTH`` its size in bytes.
Each ``send`` is written as its own gzip member and handed to the kernel at
once, so a collector killed mid-run leaves every earlier frame readable: the
reader stops at the first incomplete member or frame and reports the file
as truncated.

Why gzip (stdlib) and not zstd (cramjam): nothing to install on the host
that reads a recording (``zcat``/``gzip -dc`` everywhere), and zlib decodes a
truncated stream up to its last complete byte, which is what makes the
crash-safe prefix work. Collector output is a few MB a minute, so zstd's
speed buys nothing that matters here.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from jitterscope.schemas import topics
from jitterscope.schemas.events import Record, encode_batch, split_lines

from jitterscope.common import errors

log = logging.getLogger("jitterscope.collector.recording")

MAGIC = b"jitterscope-recording 1\n"


@dataclass(frozen=True)
class Frame:
    topic: str
    key: bytes
    records: int
    payload: bytes


def encode_frame(topic: str, key: bytes, records: int, payload: bytes) -> bytes:
    if any(c in topic for c in "\t\n") or b"\t" in key or b"\n" in key:
        raise ValueError(f"topic {topic!r} / key {key!r} may not hold a tab or newline")
    return b"%s\t%s\t%d\t%d\n" % (topic.encode(), key, records, len(payload)) + payload


def _gzip_member(data: bytes, level: int = 6) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31: gzip header and trailer
    return compressor.compress(data) + compressor.flush()


class RecordingWriter:
    """Appends frames to a recording file, one gzip member per write."""

    def __init__(self, path: Path | str, level: int = 6):
        self.path = Path(path)
        self.level = level
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.bytes_written = 0
        self._write(MAGIC)

    def _write(self, data: bytes) -> None:
        member = _gzip_member(data, self.level)
        view = memoryview(member)
        while view:
            view = view[os.write(self._fd, view):]
        self.bytes_written += len(member)

    def write(self, frames: list[tuple[str, bytes, int, bytes]]) -> None:
        """(topic, key, records, payload) frames, as one gzip member."""
        if frames:
            self._write(b"".join(encode_frame(*f) for f in frames))

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1


class RecordingReader:
    """Iterate the complete frames of a recording. ``truncated`` tells,
    after iteration, whether the file ended in the middle of something
    (a crash while writing); ``error`` says what."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.truncated = False
        self.error = ""

    def _chunks(self, chunk: int = 1 << 20) -> Iterator[bytes]:
        """The decompressed bytes of the concatenated gzip members, as far
        as they go; marks the file truncated when it ends inside a member."""
        with open(self.path, "rb") as f:
            decompressor, pending = zlib.decompressobj(31), False  # pending: a member begun, not ended
            while data := f.read(chunk):
                while data:
                    try:
                        out = decompressor.decompress(data)
                    except zlib.error as exc:
                        self.truncated, self.error = True, f"corrupt compressed data ({exc})"
                        return
                    pending = True
                    if out:
                        yield out
                    if decompressor.eof:  # a member ended: what follows starts the next one
                        data, pending = decompressor.unused_data, False
                        decompressor = zlib.decompressobj(31)
                    else:
                        data = b""
            if pending:
                self.truncated, self.error = True, "the file ends inside a compressed block"

    def __iter__(self) -> Iterator[Frame]:
        buf = bytearray()
        checked = False
        for out in self._chunks():
            buf += out
            if not checked:
                if len(buf) < len(MAGIC):
                    continue
                if not buf.startswith(MAGIC):
                    raise errors.BadConfig(f"{self.path} is not a jitterscope recording (version 1)")
                del buf[:len(MAGIC)]
                checked = True
            pos = 0
            while True:
                end = buf.find(b"\n", pos)
                if end < 0:
                    break
                try:
                    topic, key, records, length = bytes(buf[pos:end]).split(b"\t")
                    records, length = int(records), int(length)
                except ValueError:
                    self.truncated, self.error = True, f"bad frame header {bytes(buf[pos:end])[:80]!r}"
                    return
                if end + 1 + length > len(buf):
                    break
                yield Frame(topic.decode(), key, records, bytes(buf[end + 1:end + 1 + length]))
                pos = end + 1 + length
            del buf[:pos]
        if not checked:
            if not MAGIC.startswith(bytes(buf)) or (not buf and self.path.stat().st_size and not self.truncated) \
                    or (not buf and self.error.startswith("corrupt")):
                raise errors.BadConfig(f"{self.path} is not a jitterscope recording (version 1)")
            self.truncated, self.error = True, self.error or "empty file"
        elif buf and not self.truncated:
            self.truncated, self.error = True, f"the file ends inside a frame ({len(buf)} bytes left over)"


@dataclass
class Summary:
    frames: int = 0
    records: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)
    truncated: bool = False
    error: str = ""


def summarize(path: Path | str) -> Summary:
    reader = RecordingReader(path)
    summary = Summary()
    for frame in reader:
        summary.frames += 1
        summary.records += frame.records
        summary.by_topic[frame.topic] = summary.by_topic.get(frame.topic, 0) + frame.records
        summary.hosts.add(frame.key.decode(errors="replace"))
    summary.truncated, summary.error = reader.truncated, reader.error
    return summary


class RecordingPublisher:
    """What the collector uses of KafkaPublisher, writing to a recording.

    Every batch is "acknowledged" once it is written, so the collector's
    counters and stats records read as they would with Kafka."""

    def __init__(self, path: Path | str, host: str, *, max_message_bytes: int = 900_000,
                 max_records: int | None = None,
                 progress: Callable[["RecordingPublisher"], None] | None = None,
                 progress_every_s: float = 1.0, now: Callable[[], float] = time.monotonic):
        self.path = Path(path)
        self.host_key = host.encode()
        self.max_message_bytes = max_message_bytes
        self.max_records = max_records
        self.records_sent = 0
        self.messages = 0
        self.sent_by_topic: dict[str, int] = {}
        self.delivery_errors = 0
        self.given_up = 0
        self.unspooled_drops = 0
        self.producer_restarts = 0
        self.last_error: str | None = None
        self.spool = None
        self._progress, self._every, self._now = progress, progress_every_s, now
        self._next_progress = now() + progress_every_s
        self._writer: RecordingWriter | None = None

    @property
    def bytes_written(self) -> int:
        return self._writer.bytes_written if self._writer else 0

    # the spool counters of KafkaPublisher: a file has no spool
    spool_drops = property(lambda self: 0)
    spooled = property(lambda self: 0)
    undelivered = property(lambda self: self.given_up)

    def check_reachable(self, timeout_s: float = 10.0) -> None:
        """Opens (creates, truncates) the file: fails here, before the probes load."""
        if self._writer is None:
            try:
                self._writer = RecordingWriter(self.path)
            except OSError as exc:
                raise errors.BadConfig(f"cannot write the recording {self.path}: {exc}") from exc

    def send(self, topic: str, records: list[Record]) -> None:
        if self._writer is None:
            self.check_reachable()
        frames = [(topic, self.host_key, count, payload)
                  for payload, count in split_lines(encode_batch(records), self.max_message_bytes, self.max_records)]
        try:
            self._writer.write(frames)
        except OSError as exc:  # disk full: counted as lost, the collector goes on
            self.delivery_errors += 1
            self.given_up += sum(f[2] for f in frames)
            self.last_error = str(exc)
            log.error("could not write to the recording: records dropped", exc_info=False,
                      extra={"error": str(exc)})
            return
        self.messages += len(frames)
        for _t, _k, count, _p in frames:
            self.records_sent += count
        self.sent_by_topic[topic] = self.sent_by_topic.get(topic, 0) + sum(f[2] for f in frames)

    def poll(self, timeout_s: float = 0) -> None:
        if self._progress and self._now() >= self._next_progress:
            self._next_progress = self._now() + self._every
            self._progress(self)

    def flush(self, timeout_s: float = 10.0) -> int:
        if self._writer is not None:
            try:
                self._writer.sync()
            except OSError:
                pass
        return 0

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# -- replay ------------------------------------------------------------------
@dataclass
class ReplayResult:
    messages: int = 0
    records: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    truncated: bool = False
    error: str = ""


def replay(path: Path | str, bootstrap_servers: str, *,
           progress: Callable[[ReplayResult], None] | None = None, timeout_s: float = 60.0,
           extra_config: dict | None = None) -> ReplayResult:
    """Produce every frame of a recording, with its key, and wait for all
    acknowledgements. Raises BrokerUnavailable when the broker does not
    answer, BadConfig when a topic is missing (and not created)."""
    from confluent_kafka import KafkaException, Producer

    summary = summarize(path)  # also validates the file before anything is sent
    config = {"bootstrap.servers": bootstrap_servers, "acks": "all", "enable.idempotence": False,
              "compression.type": "lz4", "linger.ms": 5, "message.timeout.ms": int(timeout_s * 1000),
              "message.max.bytes": 2_000_000, "client.id": "jitterscope-replay",
              # librdkafka's lines (a refused connection, every retry) go to logging, below WARNING
              "logger": logging.getLogger("jitterscope.collector.recording.kafka")}
    config.update(extra_config or {})
    producer = Producer(config)
    try:
        metadata = producer.list_topics(timeout=10)
    except KafkaException as exc:
        raise errors.BrokerUnavailable(
            f"Kafka at {bootstrap_servers} did not answer ({exc}); start it, or pass the right "
            "--bootstrap-servers") from exc
    missing = sorted(t for t in summary.by_topic if t not in metadata.topics)
    if missing:
        raise errors.BadConfig(
            f"topics missing on {bootstrap_servers}: {', '.join(missing)}; create them "
            f"({topics.PARTITIONS} partitions each) or rerun with --create-topics")

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
