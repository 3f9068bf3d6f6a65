"""The one definition of every record jitterscope moves.

Collector and streams both import these types; nothing restates them. On the
wire a Kafka message is a batch: records of one type from one host, one JSON
object per line (NDJSON), which is also what ClickHouse's JSONEachRow and
kcat read directly.

Every record carries ``v`` (the schema version; a reader rejects versions it
does not know) and ``(host, boot_id, seq)``: ``seq`` counts per host and record
type, so the sink can insert idempotently and name gaps as losses. All
timestamps are epoch nanoseconds.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SCHEMA_VERSION = 1


class Record(msgspec.Struct, kw_only=True, frozen=True):
    v: Literal[1] = SCHEMA_VERSION
    host: str
    boot_id: str
    seq: int
    ts_ns: int


class RunqEvent(Record, frozen=True):
    """A thread waited at least the probe threshold for a CPU."""

    pid: int
    tid: int
    comm: str
    cpu: int
    wait_ns: int
    suspect_pid: int  # the task that held the CPU when the waiter got it
    suspect_tid: int
    suspect_comm: str


class RunqHistogram(Record, frozen=True):
    """Every run-queue wait of one process over ``interval_ns``, log2 buckets.

    ``slots[i]`` is a bucket of waits in [2^slot, 2^(slot+1)) microseconds
    holding ``counts[i]`` waits; empty buckets are left out.
    """

    interval_ns: int
    pid: int
    comm: str
    slots: list[int]
    counts: list[int]


class NumaNode(msgspec.Struct, frozen=True):
    node: int
    cpus: list[int]


class Topology(Record, frozen=True):
    """The host's CPUs and NUMA nodes."""

    cpus: list[int]
    numa_nodes: list[NumaNode]


class ProcessInfo(Record, frozen=True):
    """Metadata of a process the collector reports on."""

    pid: int
    comm: str
    cmdline: str
    cgroup: str
    cpus_allowed: list[int]


class CollectorStats(Record, frozen=True):
    """The collector's own counters, cumulative since it started."""

    started_ns: int
    ringbuf_drops: int
    events_read: int
    records_sent: int
    delivery_errors: int


class Alert(Record, frozen=True):
    """A root cause found in the evidence, with what to do about it.

    ``seq``/``boot_id`` are those of the evidence record, so re-processing the
    same evidence yields the same alert key. ``ts_ns`` is when the evidence
    happened, ``raised_ns`` when the rule fired (the difference is the alert
    delay).
    """

    raised_ns: int
    kind: str
    severity: str
    pid: int
    tid: int
    comm: str
    cpu: int
    wait_ns: int
    suspect_pid: int
    suspect_comm: str
    cpus_allowed: list[int]
    summary: str
    remedy: str
    request_id: str = ""  # the request it is about, for request alerts


class RequestSpan(Record, frozen=True):
    """One inference request, from an OpenTelemetry span the collector received.

    ``ts_ns`` is the span's end. ``pid`` is the serving process (0 = not known:
    attributed at host level). Phase durations are 0 where the span did not
    carry them.
    """

    request_id: str
    trace_id: str  # hex
    span_id: str  # hex
    name: str
    pid: int
    start_ns: int
    end_ns: int
    status: str  # "ok", "error" or "unset"
    queue_ns: int = 0
    prefill_ns: int = 0
    decode_ns: int = 0
    ttft_ns: int = 0


class Suspect(msgspec.Struct, frozen=True):
    pid: int
    comm: str
    wait_ns: int  # run-queue wait of the request's threads while this task held the CPU


class RequestAttribution(Record, frozen=True):
    """Why one request took as long as it did.

    ``baseline_ns`` is the host's rolling median for requests of this name;
    ``excess_ns`` what this one took beyond it. ``cause`` is the evidence that
    explains most of the excess, or "unexplained" (or "none" when there was
    no excess). Requests batched together share evidence, by design.
    """

    request_id: str
    trace_id: str
    name: str
    pid: int
    start_ns: int
    end_ns: int
    duration_ns: int
    baseline_ns: int
    excess_ns: int
    status: str
    runq_wait_ns: int
    runq_wait_max_ns: int
    runq_waits: int
    suspects: list[Suspect]
    cause: str
    explained: float  # share of the excess the cause accounts for, 0..1
    slo_ns: int
    slo_breached: bool


class DeadLetter(msgspec.Struct, kw_only=True, frozen=True):
    """Input that could not be decoded, kept with the reason."""

    topic: str
    partition: int
    offset: int
    line: int  # 1-based line within the message; 0 = the whole message
    reason: str
    payload: str  # the offending bytes, decoded as UTF-8 with replacement
    ts_ns: int


class BadLine(msgspec.Struct, frozen=True):
    line: int
    reason: str
    payload: bytes


def encode_batch(records: list[Record], encoder: msgspec.json.Encoder = msgspec.json.Encoder()) -> bytes:
    """NDJSON: one record a line."""
    buf = bytearray()
    for record in records:
        encoder.encode_into(record, buf, len(buf))
        buf.extend(b"\n")
    return bytes(buf)


class BatchDecoder:
    """Decodes NDJSON batches of one record type, keeping bad lines apart.

    The fast path decodes the whole batch in one msgspec call; only when that
    fails are lines decoded one by one to find which are bad and why.
    """

    def __init__(self, record_type: type[Record]):
        self.record_type = record_type
        self._batch = msgspec.json.Decoder(list[record_type])
        self._one = msgspec.json.Decoder(record_type)

    def decode(self, payload: bytes) -> tuple[list[Record], list[BadLine]]:
        lines = [line for line in payload.split(b"\n") if line.strip()]
        if not lines:
            return [], [BadLine(0, "empty message", payload)]
        try:
            records = self._batch.decode(b"[" + b",".join(lines) + b"]")
            if len(records) == len(lines):  # else a line held two records, or half of one
                return records, []
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        good: list[Record] = []
        bad: list[BadLine] = []
        for number, line in enumerate(payload.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                good.append(self._one.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                bad.append(BadLine(number, _reason(exc), line))
        return good, bad


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "$.v" in text:
        return f"unknown schema version ({text}); this reader knows v{SCHEMA_VERSION}"
    return text
