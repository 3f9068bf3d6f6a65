"""Batched, idempotent writes to ClickHouse from the streams worker.

Agents hand a whole take_events() batch to ``write`` and only return (and so
let Faust commit the offsets) once it is stored: a crash replays the batch, and
the ReplacingMergeTree key (host, boot_id, seq) collapses the replay.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from clickhouse_connect.driver.exceptions import OperationalError
from prometheus_client import Counter

from jitterscope.streams import clickhouse

log = logging.getLogger("jitterscope.streams.sink")

ROWS_WRITTEN = Counter("jitterscope_streams_rows_written_total", "rows inserted into ClickHouse", ["table"])
INSERT_FAILURES = Counter("jitterscope_streams_insert_failures_total", "ClickHouse inserts that failed and were retried", ["table"])


class ClickHouseSink:
    def __init__(self, client, retry_delay_s: float = 1.0, max_attempts: int = 3):
        self.client = client
        self.max_attempts = max_attempts
        self.retry_delay_s = retry_delay_s
        # chDB serialises calls per client; one thread keeps inserts ordered.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")

    async def write(self, table: str, records: list) -> None:
        """Insert. An unreachable server is retried until it answers (the
        batch waits, uncommitted); any other error is retried a few times and
        then raised, so the caller can dead-letter the batch with the reason."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                await loop.run_in_executor(self._executor, clickhouse.insert_records, self.client, table, records)
                ROWS_WRITTEN.labels(table).inc(len(records))
                return
            except Exception as exc:
                INSERT_FAILURES.labels(table).inc()
                attempt += 1
                if not isinstance(exc, OperationalError) and attempt >= self.max_attempts:
                    raise
                log.warning("insert into %s failed (%s); retrying in %.0fs", table, exc, self.retry_delay_s)
                await asyncio.sleep(self.retry_delay_s)

    async def run(self, fn, *args):
        """Run a blocking client call (e.g. a query) on the sink's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
