# SPDX-License-Identifier: Apache-2.0
"""Record: the collector's Kafka messages in a file (replay: collector/replay.py).

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

Reading trusts nothing in the file (it may come from another host, or
from an attacker): frame headers and payloads are capped
(``MAX_HEADER_BYTES``, ``MAX_FRAME_BYTES``) and decompression goes a bounded
step at a time, so a small file that inflates to gigabytes (a "zip bomb") or
a header claiming a huge length is refused after reading at most a few MB.
Replay (collector/replay.py) produces only to jitterscope's input topics,
only the frames keyed for the host the user names (``--host``), and only
frames whose every record carries that host.

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

from jitterscope.schemas.events import Record
from jitterscope.schemas.batches import encode_batch, split_lines

from jitterscope.common import errors
from jitterscope.common.private import open_private, private_dir

log = logging.getLogger("jitterscope.collector.recording")

MAGIC = b"jitterscope-recording 1\n"

#: A frame header is a topic (~30 bytes), a key (a host name: 255 bytes at
#: most), and two integers; anything longer is not a header.
MAX_HEADER_BYTES = 1024
#: A frame is one Kafka message. The recorder cuts them below
#: kafka_max_message_bytes (900 kB by default) and never writes one above this
#: (RecordingPublisher clamps), and replay's producer sends at most 2 MB
#: (message.max.bytes): a longer frame can only be damage or an attack.
MAX_FRAME_BYTES = 4 << 20
#: Decompressed bytes per step. With the caps above, reading holds at most
#: MAX_HEADER_BYTES + MAX_FRAME_BYTES + _STEP of decompressed data at once.
_STEP = 1 << 20


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
        private_dir(self.path.parent)
        # command lines inside: 0600, and never written through a symlink
        self._fd = open_private(self.path)
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
        as they go, at most ``_STEP`` at a time (a compression bomb inflates
        only as fast as the reader consumes it); marks the file truncated
        when it ends inside a member."""
        with open(self.path, "rb") as f:
            decompressor, pending = zlib.decompressobj(31), False  # pending: a member begun, not ended
            data, held = b"", False  # held: zlib may hold output it had no room for
            while True:
                if not data and not held:
                    data = f.read(chunk)
                    if not data:
                        break
                try:
                    out = decompressor.decompress(data, _STEP)
                except zlib.error as exc:
                    self.truncated, self.error = True, f"corrupt compressed data ({exc})"
                    return
                pending, held = True, len(out) == _STEP
                if out:
                    yield out
                if decompressor.eof:  # a member ended: what follows starts the next one
                    data, pending, held = decompressor.unused_data, False, False
                    decompressor = zlib.decompressobj(31)
                else:
                    data = decompressor.unconsumed_tail
            if pending:
                self.truncated, self.error = True, "the file ends inside a compressed block"

    def _refuse(self, why: str) -> errors.BadConfig:
        return errors.BadConfig(f"{self.path} is refused: {why} (it is damaged, or was not written by "
                                "'jitterscope record')")

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
                end = buf.find(b"\n", pos, pos + MAX_HEADER_BYTES + 1)
                if end < 0:
                    if len(buf) - pos > MAX_HEADER_BYTES:
                        raise self._refuse(f"a frame header runs past {MAX_HEADER_BYTES} bytes")
                    break
                try:
                    topic, key, records, length = bytes(buf[pos:end]).split(b"\t")
                    if not (records.isdigit() and length.isdigit()):
                        raise ValueError("not counts")
                    records, length, topic = int(records), int(length), topic.decode()
                except ValueError:
                    self.truncated, self.error = True, f"bad frame header {bytes(buf[pos:end])[:80]!r}"
                    return
                if length > MAX_FRAME_BYTES:
                    raise self._refuse(f"a frame claims {length:,} bytes, more than a recording frame may hold "
                                       f"({MAX_FRAME_BYTES:,})")
                if records > length:  # every record is a line, with its newline
                    raise self._refuse(f"a frame claims {records:,} records in {length:,} bytes")
                if end + 1 + length > len(buf):
                    break
                yield Frame(topic, key, records, bytes(buf[end + 1:end + 1 + length]))
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
        self.max_message_bytes = min(max_message_bytes, MAX_FRAME_BYTES)  # what a reader accepts
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
        too_long = [f for f in frames if len(f[3]) > self.max_message_bytes]
        if too_long:  # one record over the limit, as KafkaPublisher: counted, not written
            frames = [f for f in frames if len(f[3]) <= self.max_message_bytes]
            self.given_up += sum(f[2] for f in too_long)
            self.last_error = f"one record of {len(too_long[0][3])} bytes > kafka_max_message_bytes"
            log.error("batch too large for a message: records dropped", extra={"error": self.last_error})
            if not frames:
                return
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
