# SPDX-License-Identifier: Apache-2.0
"""A bounded on-disk spool for batches Kafka cannot take (broker down longer
than the in-memory buffer, delivery errors).

Layout: append-only segment files ``<number>.spool`` in one directory, one
record a line as ``<topic> <record json>\\n`` (records are single-line JSON,
so a line is a record and a crash can tear at most the last line of the last
segment). Lines are written and flushed to the OS per batch: a killed
collector loses nothing it spooled; a power cut may lose the tail (no fsync
per batch: too slow for a storm, and the spool is a fallback).

Replay hands out one whole segment at a time, re-batched per topic; a segment
is deleted once every batch taken from it is settled (acknowledged by Kafka,
or written again to the tail). So a crash during replay re-sends, never
loses; duplicates are harmless (the sink is idempotent on host, boot_id, seq).

Full (``max_bytes``): the batch is refused and its records counted in
``drops``. Torn or foreign lines found at replay are skipped and counted in
``torn`` (and in ``drops``: those records are lost).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from jitterscope.common.private import open_private, private_dir
from jitterscope.schemas.batches import split_lines

SEGMENT_BYTES = 4 << 20  # granularity of deletion and of one replay step
SUFFIX = ".spool"


@dataclass
class Batch:
    topic: str
    payload: bytes  # NDJSON, as produced to Kafka
    count: int
    segment: Path | None = None  # the segment it was replayed from, settled on delivery


class SpoolBusy(Exception):
    """Another collector holds this spool directory."""


class Spool:
    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int = SEGMENT_BYTES):
        private_dir(directory)  # the data dir too, when the spool is first to make it
        self.dir = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = os.fdopen(open_private(directory / "lock"), "w")
        try:  # two writers would interleave lines and delete each other's segments
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise SpoolBusy(f"spool {directory} is in use by another process") from None
        self.drops = 0  # records refused (spool full) or lost (torn lines)
        self.torn = 0
        self._segments: list[Path] = sorted(directory.glob(f"*{SUFFIX}"), key=lambda p: int(p.stem))
        self._sizes = {p: p.stat().st_size for p in self._segments}
        # records in the spool now; segments left by an earlier run are counted by their lines
        self.records = sum(p.read_bytes().count(b"\n") for p in self._segments)
        self._next = int(self._segments[-1].stem) + 1 if self._segments else 0
        self._writer = None  # the tail segment open for appending
        self._taken: dict[Path, int] = {}  # segment handed out -> batches not yet settled

    # -- writing -----------------------------------------------------------
    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    def __bool__(self) -> bool:
        """Something waits to be replayed."""
        return any(p not in self._taken for p in self._segments)

    def append(self, topic: str, payload: bytes, count: int) -> bool:
        prefix = topic.encode() + b" "
        data = b"".join(prefix + line for line in payload.splitlines(keepends=True) if line.strip())
        if self.bytes + len(data) > self.max_bytes:
            self.drops += count
            return False
        try:
            if self._writer is None or self._sizes[self._segments[-1]] >= self.segment_bytes:
                self._rotate()
            self._writer.write(data)
            self._writer.flush()
        except OSError:  # disk full or gone: the same as a full spool (a partly written line is torn)
            self.drops += count
            self._close_writer()
            return False
        self._sizes[self._segments[-1]] += len(data)
        self.records += count
        return True

    def _rotate(self) -> None:
        self._close_writer()
        path = self.dir / f"{self._next:012d}{SUFFIX}"
        self._next += 1
        self._writer = os.fdopen(open_private(path, append=True), "ab")  # records' command lines: 0600
        self._segments.append(path)
        self._sizes[path] = 0

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- replay ------------------------------------------------------------
    def take(self, max_bytes: int, max_records: int) -> list[Batch]:
        """The batches of the oldest segment not handed out yet, in order."""
        head = next((p for p in self._segments if p not in self._taken), None)
        if head is None:
            return []
        if self._writer is not None and head == self._segments[-1]:
            self._close_writer()  # appends go to a new segment from now on
        data = head.read_bytes()
        groups: list[tuple[str, list[bytes]]] = []  # consecutive lines of one topic
        lines = data.split(b"\n")
        if lines[-1]:  # no newline at the end: torn by a crash mid-write (never counted in records)
            self.torn += 1
            self.drops += 1
        for line in lines[:-1]:
            topic, sep, record = line.partition(b" ")
            if not sep or not record.startswith(b"{"):
                self.torn += 1
                self.drops += 1
                self.records -= 1
                continue
            name = topic.decode(errors="replace")
            if not groups or groups[-1][0] != name:
                groups.append((name, []))
            groups[-1][1].append(record + b"\n")
        out = [Batch(topic, chunk, n, head)
               for topic, records in groups for chunk, n in split_lines(b"".join(records), max_bytes, max_records)]
        self._taken[head] = len(out)
        if not out:
            self._delete(head)
        return out

    def settle(self, batch: Batch) -> None:
        """A replayed batch is safe elsewhere (in Kafka, or spooled again)."""
        self.records -= batch.count
        left = self._taken.get(batch.segment, 0) - 1
        self._taken[batch.segment] = left
        if left <= 0:
            self._delete(batch.segment)

    def _delete(self, segment: Path) -> None:
        segment.unlink(missing_ok=True)
        self._taken.pop(segment, None)
        self._sizes.pop(segment, None)
        if segment in self._segments:
            self._segments.remove(segment)

    def close(self) -> None:
        self._close_writer()
        self._lock.close()
