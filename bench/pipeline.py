# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py decode`, `pipeline`, `storm`, `attribution`, `saved`, `storage`:
the streams side: batch decoding, a real worker's store path, its memory in a
storm, attribution, the saved fleet queries and the run-queue table's storage
variants."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from common import StreamsWorker, _module_at, best_of, synthetic_runq

from jitterscope.schemas import batches, events


def bench_decode() -> str:
    """Batch decode (one msgspec call) vs the naive per-line json.loads."""
    records = synthetic_runq("bench", 500)
    payload = batches.encode_batch(records)
    messages = [payload] * 200  # 100k events
    decoder = batches.BatchDecoder(events.RunqEvent)
    ours = best_of(lambda: [decoder.decode(m) for m in messages])
    naive = best_of(lambda: [[json.loads(line) for line in m.splitlines()] for m in messages])
    n = 500 * len(messages)
    return (f"| decode 100k runq events, 500/message | {n / ours:,.0f} events/s | per-line json.loads "
            f"{n / naive:,.0f} events/s | {naive / ours:.1f}x faster |")


def bench_pipeline(n: int = 200_000) -> str:
    """Events/s one streams worker carries from Kafka into ClickHouse."""
    with StreamsWorker(runq_alert_ms="1000000") as worker:  # measure the storage path, not alerting
        produced, stored = worker.send_and_wait(8, n)
    return (f"| {n:,} runq events produced (500/message, lz4) → 1 Faust worker → chDB | "
            f"{n / stored:,.0f} events/s stored | producer alone {n / produced:,.0f} events/s | "
            f"worker at {produced / stored:.2f}x the producer's rate |")


def bench_storm_memory(n: int = 1_000_000) -> str:
    """Worker RSS after a one-host storm: evidence bounded by count (the
    default) vs bounded by time only (the horizon), same run."""
    rss = {}
    for name, bound in (("bounded", None), ("time only", str(10**9))):
        settings = {"evidence_max_events": bound} if bound else {}
        with StreamsWorker(runq_alert_ms="1000000", **settings) as worker:
            idle = worker.rss_mb()
            worker.send_and_wait(1, n)
            rss[name] = (idle, worker.rss_mb())
    (idle, bounded), (_, unbounded) = rss["bounded"], rss["time only"]
    return (f"| worker RSS after a {n:,}-event one-host storm, evidence bounded by count (200k/host) | "
            f"{bounded:,.0f} MB (idle {idle:,.0f} MB) | bounded by time only {unbounded:,.0f} MB | "
            f"{bounded / unbounded:.2f}x |")


def bench_attribution(requests: int = 50_000) -> str:
    """Requests/s one worker's attribution step handles, on a busy host: 16
    serving processes, 20k run-queue events in the window (a heavily
    contended host), requests of ~50 ms. Baseline: the same requests against
    an empty evidence window (the fixed per-request cost)."""
    from jitterscope.streams.attribution import Attributor

    ms = 1_000_000
    t0 = time.time_ns()

    def spans():
        return [events.RequestSpan(host="h", boot_id="b", seq=i, ts_ns=t0 + i * ms, request_id=f"r{i}",
                                   trace_id="ab" * 16, span_id="cd" * 8, name="llm_request", pid=1000 + i % 16,
                                   start_ns=t0 + i * ms, end_ns=t0 + i * ms + 50 * ms, status="ok")
                for i in range(requests)]

    def run(with_evidence: bool) -> float:
        a = Attributor(horizon_ns=10**15)
        if with_evidence:
            for i in range(20_000):
                a.add_evidence(events.RunqEvent(
                    host="h", boot_id="b", seq=i, ts_ns=t0 + i * (requests * ms // 20_000) + 8 * ms,
                    pid=1000 + i % 16, tid=2000 + i % 64, comm="vllm", cpu=i % 64, wait_ns=8 * ms,
                    suspect_pid=300 + i % 5, suspect_tid=300, suspect_comm=f"job{i % 5}"))
        todo = spans()
        for s in todo:
            a.add_request(s)
        t = time.perf_counter()
        done = a.due(t0 + requests * ms + 10**12)
        elapsed = time.perf_counter() - t
        assert len(done) == requests
        return requests / elapsed

    busy, empty = run(True), run(False)
    return (f"| attribute {requests:,} requests (16 processes, 20k waits in the window) | {busy:,.0f} requests/s | "
            f"no evidence in the window {empty:,.0f} requests/s | {busy / empty:.2f}x |")


#: run-queue events in the `saved` bench's fleet: BENCH_RUNQ_EVENTS=100000000 for issue 13's goal
SAVED_EVENTS = int(os.environ.get("BENCH_RUNQ_EVENTS", 2_000_000))

#: noisy-neighbours as it was before the runq_minute rollup (migration 008): the same-run baseline
RAW_NOISY_NEIGHBOURS = """SELECT suspect_comm AS command, count() AS starvations, uniqExact(host) AS hosts,
       round(sum(wait_ns) / 1e9, 2) AS waited_s, round(max(wait_ns) / 1e6, 1) AS worst_ms
FROM jitterscope.runq_events FINAL
WHERE ts > now64(9) - toIntervalSecond({since:UInt32}) AND suspect_pid != 0 AND suspect_pid != pid
GROUP BY suspect_comm ORDER BY starvations DESC, command LIMIT {limit:UInt32}"""


def _stored_bytes(client, table: str) -> tuple[int, int, int]:
    """(rows, bytes on disk, uncompressed bytes) of a table's active parts."""
    return client.query("SELECT sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes) FROM system.parts "
                        "WHERE database = 'jitterscope' AND table = {t:String} AND active",
                        parameters={"t": table}).result_rows[0]


#: the ledger before per-block seq bitmaps (issue 13): the saved bench's ledger baseline
LEDGER_BEFORE = "7b2b8d9"


def bench_saved_queries() -> str:
    """Latency of each saved fleet query and of the whole capacity report over
    the synthetic fleet (300 hosts, SAVED_EVENTS run-queue events, 432k
    histogram rows, 200k attributions), best of 3 and worst of 3 after a warm-up,
    against noisy-neighbours' old raw-events FINAL scan in the same store; the
    ledger against the ledger as at LEDGER_BEFORE (asserting the same rows);
    the cost of the sink's key look-up on runq_events (what keeps runq_minute
    exact); and the bytes each stored row takes, per table."""
    import msgspec

    from jitterscope.reports import capacity, queries, synthetic
    from jitterscope.streams import clickhouse, sink

    n = SAVED_EVENTS
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as data:
        client = clickhouse.connect(None, Path(data))
        clickhouse.migrate(client)
        started = time.perf_counter()
        synthetic.load_fleet(client, runq_events=n, progress=lambda i, k: print(
            f"  loading {i}/{k} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True))
        loaded = time.perf_counter() - started
        for table in ("runq_events", "runq_minute"):
            client.command(f"OPTIMIZE TABLE jitterscope.{table} FINAL")

        def timed(fn) -> tuple[float, float]:
            fn()  # warm-up: the first run reads from disk into the page cache
            runs = [best_of(fn, 1) for _ in range(3)]
            return min(runs), max(runs)

        params = {"since": "604800", "limit": "20"}
        raw, raw_worst = timed(lambda: client.query(RAW_NOISY_NEIGHBOURS, parameters=params))
        base = f"old noisy-neighbours (raw events FINAL) {raw * 1000:,.0f} ms (worst {raw_worst * 1000:,.0f})"
        lines = [f"| synthetic fleet load: {n:,} runq events | {loaded:.0f} s | | |"]
        for name in queries.SAVED:
            sql, params = queries.bind(name, {})
            took, worst = timed(lambda: client.query(sql, parameters=params))
            lines.append(f"| saved query `{name}` at {n:,} events | {took * 1000:,.0f} ms (worst {worst * 1000:,.0f}) "
                         f"| {base} | {took / raw:.3f}x |")
        # the ledger as it was (every stored seq sorted): the same rows, in how long
        ledger_sql, ledger_params = queries.bind("ledger", {"limit": "1000000"})  # every row compared
        before_sql = _module_at(LEDGER_BEFORE, "reports/ledger.py").sql()
        rows = client.query(ledger_sql, parameters=ledger_params).result_rows
        assert rows == client.query(before_sql, parameters=ledger_params).result_rows, "the ledgers disagree"
        new_took, _ = timed(lambda: client.query(ledger_sql, parameters=ledger_params))
        old_took, old_worst = timed(lambda: client.query(before_sql, parameters=ledger_params))
        lines.append(f"| saved query `ledger`, all {len(rows)} host/boot rows, the same as before's | "
                     f"{new_took * 1000:,.0f} ms | the ledger as at {LEDGER_BEFORE} (every seq sorted) "
                     f"{old_took * 1000:,.0f} ms (worst {old_worst * 1000:,.0f}) | {new_took / old_took:.4f}x |")
        ctx = capacity.Context(lambda sql, p: client.query(sql, parameters=p).result_rows, 7 * 86400, None)
        took, worst = timed(lambda: capacity.build(ctx))
        lines.append(f"| `report` (every section) at {n:,} events | {took * 1000:,.0f} ms (worst {worst * 1000:,.0f}) "
                     f"| {base} | {took / raw:.2f}x |")
        batch = synthetic_runq(synthetic.WORST_RUNQ_HOST, 500)
        newest = client.query("SELECT toUnixTimestamp64Nano(max(ts)) FROM jitterscope.runq_events").result_rows[0][0]
        batch = [msgspec.structs.replace(r, ts_ns=newest - 1_000_000_000 + i * 1_000_000, seq=10**9 + i)
                 for i, r in enumerate(batch)]  # a batch at the stored end of a host: the look-up's real case
        look, look_worst = timed(lambda: sink.stored_keys(client, "runq_events", batch))
        store, _ = timed(lambda: clickhouse.insert_records(client, "runq_events", batch))
        lines.append(f"| sink key look-up on runq_events (500-event batch, {n:,} stored) | {look * 1000:.1f} ms "
                     f"(worst {look_worst * 1000:.1f}) | the batch's insert {store * 1000:.1f} ms | "
                     f"{look / store:.2f}x |")
        for table in ("runq_events", "runq_minute", "latency_histograms", "latency_minute", "request_attribution"):
            rows, on_disk, unpacked = _stored_bytes(client, table)
            lines.append(f"| bytes per stored {table} row | {on_disk / rows:.1f} B on disk ({rows:,} rows) | "
                         f"uncompressed {unpacked / rows:.1f} B | {unpacked / on_disk:.1f}x compression |")
        client.close()
    return "\n".join(lines)


#: runq_events' columns and types (schemas/clickhouse/001 + 007); codecs vary per storage variant
RUNQ_COLUMNS = {"host": "LowCardinality(String)", "boot_id": "LowCardinality(String)", "seq": "UInt64",
                "ts": "DateTime64(9)", "pid": "UInt32", "tid": "UInt32", "comm": "LowCardinality(String)",
                "cpu": "UInt16", "wait_ns": "UInt64", "suspect_pid": "UInt32", "suspect_tid": "UInt32",
                "suspect_comm": "LowCardinality(String)", "victim_stack": "UInt64", "suspect_stack": "UInt64"}
AS_STORED = {"ts": "Delta, ZSTD(1)", "wait_ns": "T64, ZSTD(1)", "victim_stack": "T64, ZSTD(1)",
             "suspect_stack": "T64, ZSTD(1)"}
#: every column compressed: small integers T64 (drops unused high bits), counters and times by delta
#: (Gorilla is refused on integer columns: a floating-point codec)
PACKED = {c: "ZSTD(1)" for c in RUNQ_COLUMNS} | {
    "seq": "Delta, ZSTD(1)", "ts": "DoubleDelta, ZSTD(1)", "pid": "T64, ZSTD(1)", "tid": "T64, ZSTD(1)",
    "cpu": "T64, ZSTD(1)", "wait_ns": "T64, ZSTD(1)", "suspect_pid": "T64, ZSTD(1)", "suspect_tid": "T64, ZSTD(1)",
    "victim_stack": "T64, ZSTD(1)", "suspect_stack": "T64, ZSTD(1)"}
KEY = "host, ts, boot_id, seq"
#: migration 015's contract, as the sink applies it (streams/clickhouse.py MICROSECOND_FIELDS)
MICROSECONDS = {"ts": "fromUnixTimestamp64Nano(intDiv(toUnixTimestamp64Nano(runq_events.ts), 1000) * 1000)",
                "wait_ns": "intDiv(runq_events.wait_ns, 1000) * 1000"}
STORAGE_VARIANTS = {  # name -> (codec per column, sort key[, column -> stored expression])
    "as stored (001/007)": (AS_STORED, KEY),
    "all columns ZSTD(1), ts DoubleDelta": (PACKED, KEY),
    "same, ts Delta (applied in 008)": (PACKED | {"ts": "Delta, ZSTD(1)"}, KEY),
    "same, ts Delta (as 008), small integers ZSTD(1) without T64": (
        PACKED | {"ts": "Delta, ZSTD(1)"} | {c: "ZSTD(1)" for c in ("pid", "tid", "cpu", "suspect_pid", "suspect_tid")},
        KEY),
    "same, ts Delta, wait_ns ZSTD(3)": (PACKED | {"ts": "Delta, ZSTD(1)", "wait_ns": "T64, ZSTD(3)"}, KEY),
    "same, ts DoubleDelta, ZSTD(3)": ({c: v.replace("ZSTD(1)", "ZSTD(3)") for c, v in PACKED.items()}, KEY),
    "same, wait_ns Delta": (PACKED | {"wait_ns": "Delta, ZSTD(1)"}, KEY),
    # not applied (a type change: DateTime64(6), wait in us): what the ns digits below a microsecond cost. The
    # columns hold the us counts themselves, as such columns would (a multiple of 1000 in ns saves ~nothing)
    "as 008, ts and wait_ns stored in microseconds": (
        PACKED | {"ts": "Delta, ZSTD(1)"}, KEY,
        {"ts": "fromUnixTimestamp64Nano(toUnixTimestamp64Micro(runq_events.ts))",
         "wait_ns": "intDiv(runq_events.wait_ns, 1000)"}),
    # applied in 015: the columns stay ns (readers unchanged), the sink truncates to whole us, GCD divides it out
    "as 015: ts and wait_ns truncated to whole us in their ns columns, GCD codec": (
        PACKED | {"ts": "GCD, Delta, T64, ZSTD(1)", "wait_ns": "GCD, T64, ZSTD(1)"}, KEY, MICROSECONDS),
    "same, ts GCD, Delta, ZSTD(1) (no T64)": (
        PACKED | {"ts": "GCD, Delta, ZSTD(1)", "wait_ns": "GCD, T64, ZSTD(1)"}, KEY, MICROSECONDS),
    "same, truncated to whole us without GCD": (PACKED | {"ts": "Delta, ZSTD(1)"}, KEY, MICROSECONDS),
    "ZSTD(1) + DoubleDelta, key (host, tid, ts)": (PACKED, "host, tid, ts, boot_id, seq"),
    "ZSTD(1) + DoubleDelta, key (host, comm, tid, ts)": (PACKED, "host, comm, tid, ts, boot_id, seq"),
}
STORAGE_EVENTS = int(os.environ.get("BENCH_STORAGE_EVENTS", 5_000_000))


def bench_storage() -> str:
    """Bytes per stored run-queue event under each codec/sort-key variant, over
    the synthetic fleet's run-queue events (per-host time order and seq, ns
    times, as a collector sends them; 300 hosts at the per-host rate of 100M events a
    day), each variant fully merged; and the columns that cost most in each."""
    from jitterscope.reports import synthetic
    from jitterscope.streams import clickhouse

    n = STORAGE_EVENTS
    lines = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as data:
        client = clickhouse.connect(None, Path(data))
        clickhouse.migrate(client)
        # as dense per host as a 100M-event day over 300 hosts: time deltas shrink with density
        # at ns, as the collector sends them: the variants before 015 stored them so
        for sql in synthetic.runq_statements(300, n, max(60, 86400 * n // 100_000_000), time.time_ns(), 1):
            client.command(sql, parameters={"suspects": synthetic.SUSPECTS})
        for i, (name, (codecs, key, *rounded)) in enumerate(STORAGE_VARIANTS.items()):
            stored = rounded[0] if rounded else {}
            table = f"runq_variant_{i}"
            columns = ", ".join(f"{c} {t}" + (f" CODEC({codecs[c]})" if c in codecs else "")
                                for c, t in RUNQ_COLUMNS.items())
            client.command(f"CREATE TABLE jitterscope.{table} ({columns}) ENGINE = ReplacingMergeTree "
                           f"PARTITION BY toDate(ts) ORDER BY ({key})")
            client.command(f"INSERT INTO jitterscope.{table} SELECT "
                           f"{', '.join(stored.get(c, c) + f' AS {c}' for c in RUNQ_COLUMNS)} "
                           "FROM jitterscope.runq_events")
            client.command(f"OPTIMIZE TABLE jitterscope.{table} FINAL")
            rows, on_disk, _ = _stored_bytes(client, table)
            per_column = client.query(
                "SELECT name, sum(data_compressed_bytes) AS b FROM system.columns WHERE database = 'jitterscope' "
                "AND table = {t:String} GROUP BY name ORDER BY b DESC", parameters={"t": table}).result_rows
            top = ", ".join(f"{c} {b / rows:.2f}" for c, b in per_column[:4])
            lines.append(f"| runq_events {name}: ORDER BY ({key}) | {on_disk / rows:.2f} B/event on disk "
                         f"({rows:,} rows; largest columns B/event: {top}) | as stored first row | |")
        client.close()
    first = float(lines[0].split("| ")[2].split(" B")[0])
    return "\n".join(line.replace("| as stored first row | |", f"| as stored {first:.2f} B/event | "
                                   f"{float(line.split('| ')[2].split(' B')[0]) / first:.2f}x |") for line in lines)
