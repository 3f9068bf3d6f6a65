# SPDX-License-Identifier: Apache-2.0
"""The loss ledger: every way a record can be lost, per host and boot.

    jitterscope ledger [--since 7d] [--host gpu-a1] [-f csv|json]
    jitterscope query --saved ledger -p since=7d

One row per (host, boot_id) active in the period (a boot is accounted whole,
not cut at the period's start, since its counters are cumulative):

- ``collector_runs``: collector starts (``collector_stats.started_ns``).
- ``ringbuf_drops``, ``map_full_drops`` (in the kernel), ``delivery_errors``
  (producer), ``spool_drops``, ``producer_restarts``: each is cumulative per
  collector run, so the run's max, summed over its runs.
- ``dead_letters``: the ``deadletter`` table has the sending host but no
  boot; the boot is read from the bad line itself when it is JSON that names
  one, else the letter is booked on boot ``''`` of its host.
- ``seq_gaps`` / ``seq_missing``: holes in each stored table's ``seq`` and the
  records they leave out. ``seq`` counts per host and record type from a base
  taken at each collector start (microseconds since boot), so a jump to the
  next run's base is no loss. Rule: a hole counts when it leaves out fewer
  than 1,000,000 records; run bases are at least the collector's lifetime in
  microseconds apart (its start alone -- BPF compilation -- takes seconds).
  A loss of a million records in a row would be read as a new run; sent
  against stored still shows it.
- ``sent`` / ``stored`` / ``unstored``: records Kafka acknowledged (the last
  ``sent_by_topic`` of each run, summed) against records stored (distinct
  ``seq``), per topic; ``unstored`` sums, per topic, what was sent but not
  stored. Records sent after a run's last stats record are stored but not yet
  counted as sent, so ``stored`` may exceed ``sent``; ``unstored`` never goes
  below 0 for that reason.

The stored seqs are read from ``seq_blocks`` (schemas/clickhouse/009_seq_ledger.sql):
a roaring bitmap per (host, boot, table, block of 2^20 seqs). A block whose
cardinality is max - min + 1 has no hole; a hole between blocks shows in
their max and min; only a block with a hole inside is expanded. So the query
reads a few rows per host and boot, not every stored record (bench/RESULTS.md).

Parameters are bound by ClickHouse, never pasted into the SQL.
"""

from __future__ import annotations

from jitterscope.schemas import topics
from jitterscope.schemas.signals import DATABASE as DB, TABLE_OF

QUESTION = ("What did each host lose, per boot: kernel drops, producer and spool failures, dead letters, seq gaps, "
            "unstored?")
PARAMS = {"host": ("String", "")}  # '' = every host
MAX_GAP = 1_000_000  # see the module doc: larger jumps are new collector runs

#: input topic -> the table its records are stored in
TABLE_OF_TOPIC = {topic: TABLE_OF[record_type] for topic, record_type in topics.INPUT_TOPICS.items()}

HOST = "({host:String} = '' OR host = {host:String})"
RECENT = "max(ts) > now64(9) - toIntervalSecond({since:UInt32})"
COUNTERS = ("ringbuf_drops", "map_full_drops", "delivery_errors", "spool_drops", "producer_restarts")
COLUMNS = ("collector_runs", *COUNTERS, "dead_letters", "seq_gaps", "seq_missing", "sent", "stored", "unstored")


def _row(**given: str) -> str:
    """A SELECT list with every ledger column: the given ones, 0 for the rest
    (the sources are UNION ALLed, then summed per host and boot)."""
    return ", ".join(f"{given.get(c, '0')} AS {c}" for c in COLUMNS)


#: seqs per seq_blocks block (009_seq_ledger.sql's intDiv)
BLOCK = 1 << 20


def _stored() -> str:
    """Per (host, boot, topic): distinct stored seqs, and the holes in them --
    inside a block (only a block that has one is expanded) and between
    consecutive blocks (the next block's min against this one's max)."""
    tables, names = list(TABLE_OF_TOPIC.values()), list(TABLE_OF_TOPIC)
    holes = f"arrayFilter(d -> d > 1 AND d <= {MAX_GAP}, arrayDifference(bitmapToArray(seqs)))"
    return f"""
        SELECT host, boot_id, transform(tbl, {tables}, {names}, '') AS topic, 0 AS sent_n,
               sum(n) AS stored_n, sum(inner_gaps) + countIf(step > 1 AND step <= {MAX_GAP}) AS gaps,
               sum(inner_missing) + sumIf(step - 1, step > 1 AND step <= {MAX_GAP}) AS missing
        FROM (
            SELECT host, boot_id, tbl, n, inner_gaps, inner_missing, last,
                   if(row_number() OVER w = 1, 1, lo - any(hi) OVER (PARTITION BY host, boot_id, tbl ORDER BY block
                                                                     ROWS BETWEEN 1 PRECEDING AND 1 PRECEDING)) AS step
            FROM (
                SELECT host, boot_id, tbl, block, bitmapCardinality(seqs) AS n, bitmapMin(seqs) AS lo,
                       bitmapMax(seqs) AS hi, last,
                       if(n = hi - lo + 1, [], {holes}) AS inside, length(inside) AS inner_gaps,
                       arraySum(d -> d - 1, inside) AS inner_missing
                FROM (SELECT host, boot_id, tbl, block, groupBitmapMergeState(seqs) AS seqs, max(last_ts) AS last
                      FROM {DB}.seq_blocks WHERE {HOST} GROUP BY host, boot_id, tbl, block))
            WINDOW w AS (PARTITION BY host, boot_id, tbl ORDER BY block))
        GROUP BY host, boot_id, tbl
        HAVING max(last) > now64(9) - toIntervalSecond({{since:UInt32}})"""


def sql() -> str:
    per_topic = "\n        UNION ALL".join(
        ["""
        SELECT host, boot_id, topic, n AS sent_n, 0 AS stored_n, 0 AS gaps, 0 AS missing
        FROM runs ARRAY JOIN mapKeys(sent_by_topic) AS topic, mapValues(sent_by_topic) AS n"""]
        + [_stored()])
    return f"""WITH runs AS (
    SELECT host, boot_id, started_ns, {", ".join(f"max({c}) AS {c}" for c in COUNTERS)},
           argMax(sent_by_topic, seq) AS sent_by_topic
    FROM {DB}.collector_stats FINAL
    WHERE {HOST}
    GROUP BY host, boot_id, started_ns
    HAVING {RECENT}
)
SELECT host, boot_id, {", ".join(f"sum({c}) AS {c}" for c in COLUMNS)}
FROM (
    SELECT host, boot_id, {_row(collector_runs="count()", **{c: f"sum({c})" for c in COUNTERS})}
    FROM runs GROUP BY host, boot_id
    UNION ALL
    SELECT host, boot_id, {_row(dead_letters="count()")}
    FROM (SELECT if(host != '', host, JSONExtractString(payload, 'host')) AS sender,
                 JSONExtractString(payload, 'boot_id') AS boot
          FROM {DB}.deadletter FINAL
          WHERE ts > now64(9) - toIntervalSecond({{since:UInt32}}))
    WHERE ({{host:String}} = '' OR sender = {{host:String}})
    GROUP BY sender AS host, boot AS boot_id
    UNION ALL
    SELECT host, boot_id, {_row(seq_gaps="sum(gaps)", seq_missing="sum(missing)", sent="sum(sent_n)",
                                stored="sum(stored_n)",
                                unstored="greatest(toInt64(sum(sent_n)) - toInt64(sum(stored_n)), 0)")}
    FROM ({per_topic}
    )
    GROUP BY host, boot_id, topic
)
GROUP BY host, boot_id
ORDER BY host, boot_id
LIMIT {{limit:UInt32}}"""
