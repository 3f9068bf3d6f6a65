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
  ``sent_by_topic`` of each run, summed) against records stored (``count()``
  FINAL of the topic's table), per topic; ``unstored`` sums, per topic, what
  was sent but not stored. Records sent after a run's last stats record are
  stored but not yet counted as sent, so ``stored`` may exceed ``sent``;
  ``unstored`` never goes below 0 for that reason.

Parameters are bound by ClickHouse, never pasted into the SQL.
"""

from __future__ import annotations

from jitterscope.schemas import topics
from jitterscope.streams.clickhouse import DATABASE as DB, TABLE_OF

QUESTION = "What did each host lose, per boot: kernel drops, producer and spool failures, dead letters, seq gaps, unstored?"
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


def _stored(topic: str, table: str) -> str:
    holes = f"arrayFilter(d -> d > 1 AND d <= {MAX_GAP}, arrayDifference(seqs))"
    return f"""
        SELECT host, boot_id, '{topic}' AS topic, 0 AS sent_n, length(seqs) AS stored_n,
               length({holes}) AS gaps, arraySum(d -> d - 1, {holes}) AS missing
        FROM (SELECT host, boot_id, arraySort(groupArray(seq)) AS seqs FROM {DB}.{table} FINAL
              WHERE {HOST} GROUP BY host, boot_id HAVING {RECENT})"""


def sql() -> str:
    per_topic = "\n        UNION ALL".join(
        [f"""
        SELECT host, boot_id, topic, n AS sent_n, 0 AS stored_n, 0 AS gaps, 0 AS missing
        FROM runs ARRAY JOIN mapKeys(sent_by_topic) AS topic, mapValues(sent_by_topic) AS n"""]
        + [_stored(topic, table) for topic, table in TABLE_OF_TOPIC.items()])
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
                                stored="sum(stored_n)", unstored="greatest(toInt64(sum(sent_n)) - toInt64(sum(stored_n)), 0)")}
    FROM ({per_topic}
    )
    GROUP BY host, boot_id, topic
)
GROUP BY host, boot_id
ORDER BY host, boot_id
LIMIT {{limit:UInt32}}"""
