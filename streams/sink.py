# SPDX-License-Identifier: Apache-2.0
"""Batched, idempotent writes to ClickHouse from the streams worker.

Agents hand a whole take_events() batch to ``write`` and only return (and so
let Faust commit the offsets) once it is stored: a crash replays the batch, and
the ReplacingMergeTree key (host, boot_id, seq) collapses the replay.

Materialized views see every insert, FINAL or not, so rows bound for a table
that feeds a rollup are inserted only if their key is not stored yet: a
redelivered batch (worker crash, rebalance, re-attribution after a restart)
is dropped before the views fire and the rollups stay exact. One worker owns
a host's partition, so the check and the insert do not race for a host, and
what it stored itself needs no asking: from its takeover on it keeps each
(host, boot_id)'s highest stored seq, and only a batch that reaches back to
or below it (a collector's spool replayed, a redelivery) is looked up.

An insert and the views it fires are not one transaction: a worker killed
between the two leaves rows the rollup never saw. So when a worker first
stores rows of a host (after a start or a rebalance, i.e. when it takes the
host over), it rebuilds that host's last minutes of each rollup from the
deduplicated source, with the view's own SELECT. (The ledger's seq bitmaps,
``seq_blocks``, are sets: their window is fed again, nothing deleted.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import re
from concurrent.futures import ThreadPoolExecutor

from clickhouse_connect.driver.exceptions import OperationalError
from prometheus_client import Counter

from jitterscope.streams import clickhouse

log = logging.getLogger("jitterscope.streams.sink")

ROWS_WRITTEN = Counter("jitterscope_streams_rows_written_total", "rows inserted into ClickHouse", ["table"])
INSERT_FAILURES = Counter("jitterscope_streams_insert_failures_total",
                          "ClickHouse inserts that failed and were retried", ["table"])


#: tables that feed materialized views (schemas/clickhouse/004_rollups.sql, 008_runq_rollup.sql); runq_events
#: pays a key look-up per insert (~0.25x the insert, bench/RESULTS.md issue 13) to keep runq_minute exact
ROLLUP_SOURCES = frozenset({"latency_histograms", "request_attribution", "runq_events"})


_KEY = operator.attrgetter("host", "boot_id", "seq")
_GROUP = operator.attrgetter("host", "boot_id")
_SEQ = operator.attrgetter("seq")


def seqs_by_group(records: list) -> dict[tuple[str, str], list[int]]:
    """(host, boot_id) -> the seqs of its records, in order. One step per
    run of records of one group (a message's), not per record: the
    per-record Python loops this replaced took ~0.5 us a record, half of
    what ClickHouse's parse of the same line takes (bench/RESULTS.md, issue 39)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for group, run in itertools.groupby(records, key=_GROUP):
        groups.setdefault(group, []).extend(map(_SEQ, run))
    return groups


def unseen(records: list, known: set[tuple[str, str, int]],
           groups: dict[tuple[str, str], list[int]] | None = None) -> list:
    """Records whose (host, boot_id, seq) is neither stored nor earlier in the
    batch. ``groups``: seqs_by_group(records), where the caller has it."""
    groups = seqs_by_group(records) if groups is None else groups
    if not known and all(len(set(seqs)) == len(seqs) for seqs in groups.values()):
        return list(records)  # the usual batch, new and without repeats: checked in C, not per record
    fresh, seen = [], set(known)
    for key, record in zip(map(_KEY, records), records):
        if key not in seen:
            seen.add(key)
            fresh.append(record)
    return fresh


def stored_keys(client, table: str, records: list) -> set[tuple[str, str, int]]:
    """Keys of ``records`` already in ``table``: read by the sort key's
    leading (host, ts) columns, so it touches only the batch's time range,
    and only rows within each (host, boot_id)'s seq range in the batch come
    back: a batch of many hosts would otherwise fetch every row its hosts
    stored in that time range (rows in Python, per insert)."""
    ranges = seq_ranges(records)
    ts = list(map(operator.attrgetter("ts_ns"), records))
    # lo in whole us: a table of clickhouse.MICROSECOND_FIELDS stores ts truncated
    parameters = {"hosts": sorted({host for host, _ in ranges}), "lo": min(ts) - min(ts) % 1000, "hi": max(ts)}
    clauses = []
    for i, ((host, boot_id), (first, last)) in enumerate(sorted(ranges.items())):
        clauses.append(f"(host = {{h{i}:String}} AND boot_id = {{b{i}:String}} "
                       f"AND seq BETWEEN {{f{i}:UInt64}} AND {{l{i}:UInt64}})")
        parameters.update({f"h{i}": host, f"b{i}": boot_id, f"f{i}": first, f"l{i}": last})
    result = client.query(
        f"SELECT host, boot_id, seq FROM {clickhouse.DATABASE}.{table} WHERE host IN {{hosts:Array(String)}} "
        "AND ts BETWEEN fromUnixTimestamp64Nano({lo:Int64}) AND fromUnixTimestamp64Nano({hi:Int64}) "
        f"AND ({' OR '.join(clauses)})", parameters=parameters)
    return {(host, boot_id, int(seq)) for host, boot_id, seq in result.result_rows}


def seq_ranges(records: list) -> dict[tuple[str, str], list[int]]:
    """(host, boot_id) -> [lowest, highest] seq among ``records``."""
    return {group: [min(seqs), max(seqs)] for group, seqs in seqs_by_group(records).items()}


def highest_stored(client, table: str, host: str) -> dict[tuple[str, str], int]:
    """(host, boot_id) -> the highest seq ``table`` holds for ``host``."""
    result = client.query(f"SELECT boot_id, max(seq) FROM {clickhouse.DATABASE}.{table} WHERE host = {{h:String}} "
                          "GROUP BY boot_id", parameters={"h": host})
    return {(host, boot_id): int(seq) for boot_id, seq in result.result_rows}


def unstored(client, table: str, records: list, stored_through: dict[tuple[str, str], int],
             groups: dict[tuple[str, str], list[int]] | None = None) -> list:
    """``records`` without the keys ``table`` holds already or repeats within
    them. ``stored_through``: (host, boot_id) -> the highest seq known stored,
    for every host of ``records`` (kept up to date here): only a (host,
    boot_id) whose seqs reach back to it is looked up. ``groups``: seqs_by_group(records)."""
    groups = seqs_by_group(records) if groups is None else groups
    doubtful = {group for group, seqs in groups.items() if min(seqs) <= stored_through.get(group, -1)}
    known = stored_keys(client, table, [r for r in records if _GROUP(r) in doubtful]) if doubtful else set()
    for group, seqs in groups.items():
        stored_through[group] = max(max(seqs), stored_through.get(group, -1))
    return unseen(records, known, groups)


#: how far back a taken-over host's rollups are rebuilt, before its newest stored row
REBUILD_WINDOW_S = 600
#: rollups whose states are sets and maxima (009_seq_ledger.sql's seq bitmaps): feeding the same rows
#: again changes nothing, so their rebuild only feeds the window again, without deleting it first
REFED_ROLLUPS = frozenset({"seq_blocks"})


def rebuild_rollups(client, source: str, host: str) -> None:
    """Recompute ``host``'s rollup minutes fed by ``source`` from the window
    before its newest stored row: delete them, then insert the view's SELECT
    over the FINAL source rows of that window."""
    db = clickhouse.DATABASE
    newest = client.query(f"SELECT max(ts) FROM {db}.{source} WHERE host = {{h:String}}",
                          parameters={"h": host}).result_rows[0][0]
    if newest is None or newest.year < 1971:  # nothing stored for it yet
        return
    views = client.query(
        "SELECT as_select, create_table_query FROM system.tables WHERE database = {db:String} "
        "AND engine = 'MaterializedView' AND name IN (SELECT arrayJoin(dependencies_table) FROM system.tables "
        "WHERE database = {db:String} AND name = {source:String})",
        parameters={"db": db, "source": source}).result_rows
    window = {"h": host, "newest": newest, "window": REBUILD_WINDOW_S}
    since = "toStartOfMinute({newest:DateTime64(9)} - toIntervalSecond({window:UInt32}))"
    for select, ddl in views:
        rollup = re.findall(rf"\bTO {db}\.(\w+)", ddl)[0]
        if rollup not in REFED_ROLLUPS:
            client.command(f"ALTER TABLE {db}.{rollup} DELETE WHERE host = {{h:String}} AND minute >= {since}",
                           parameters=window, settings={"mutations_sync": 2})
        filtered = f"(SELECT * FROM {db}.{source} FINAL WHERE host = {{h:String}} AND ts >= {since})"
        client.command(f"INSERT INTO {db}.{rollup} " + select.replace(f"FROM {db}.{source}", f"FROM {filtered}", 1),
                       parameters=window)


class ClickHouseSink:
    def __init__(self, client, retry_delay_s: float = 1.0):
        self.client = client
        self.retry_delay_s = retry_delay_s
        self._taken_over: set[tuple[str, str]] = set()  # (table, host) whose rollups were rebuilt
        #: table -> (host, boot_id) -> highest seq stored, for the hosts taken over (unstored())
        self._stored_through: dict[str, dict[tuple[str, str], int]] = {}
        # chDB serialises calls per client; one thread keeps inserts ordered.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")

    async def write(self, table: str, records: list) -> None:
        """Insert. An unreachable server is retried until it answers (the
        batch waits, uncommitted); any other error is the data's and is raised
        at once, so the caller can isolate the bad records and dead-letter them."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        while True:
            try:
                inserted = await loop.run_in_executor(self._executor, self._insert, table, records)
                ROWS_WRITTEN.labels(table).inc(inserted)
                return
            except OperationalError as exc:
                INSERT_FAILURES.labels(table).inc()
                log.warning("ClickHouse unreachable for %s (%s); retrying in %.0fs", table, exc, self.retry_delay_s)
                await asyncio.sleep(self.retry_delay_s)
            except Exception:
                INSERT_FAILURES.labels(table).inc()
                raise

    def _insert(self, table: str, records: list) -> int:
        """Insert; rows bound for a rollup source only if not stored yet. Returns rows inserted."""
        if table in ROLLUP_SOURCES:
            stored_through = self._stored_through.setdefault(table, {})
            groups = seqs_by_group(records)
            for host in sorted({host for host, _ in groups}):
                if (table, host) not in self._taken_over:
                    self._rebuild(table, host)
                    stored_through.update(highest_stored(self.client, table, host))
                    self._taken_over.add((table, host))
            records = unstored(self.client, table, records, stored_through, groups)
        clickhouse.insert_records(self.client, table, records)
        return len(records)

    def forget_hosts(self) -> None:
        """Another worker may have stored some hosts' rows meanwhile (this one
        was given partitions in a rebalance): take every host over afresh."""
        self._taken_over.clear()
        self._stored_through.clear()

    def _rebuild(self, table: str, host: str) -> None:
        """rebuild_rollups; a failure of its own is logged, not raised: the
        records are not at fault and must not be dead-lettered for it (an
        unreachable server still raises, and the batch waits)."""
        try:
            rebuild_rollups(self.client, table, host)
        except OperationalError:
            raise
        except Exception:
            log.exception("rebuilding the rollups of host %s from %s failed; its records are stored, its rollups "
                          "may miss what a killed worker inserted last", host, table)

    async def run(self, fn, *args):
        """Run a blocking client call (e.g. a query) on the sink's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
