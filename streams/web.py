# SPDX-License-Identifier: Apache-2.0
"""The streams worker's web pages: /metrics for Prometheus and /query, which
answers `jitterscope query` while this process holds the embedded store.

/query runs user SQL, so it asks for two things: the bearer token the worker
wrote into its state file (mode 0600: only the store's owner can read it,
while the port is open to every local user), and SQL that passes the
read-only guard, on every address the port is bound to (`streams_web_bind`:
loopback by default; a non-loopback bind for a remote Prometheus exposes
/query to the network only behind that token). /metrics stays open."""

from __future__ import annotations

import hmac
import json

import faust
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from jitterscope.common import values
from jitterscope.common.errors import UnsafeQuery
from jitterscope.streams import readonly_sql


LAG_HELP = ("records in the partition this worker has not read yet: the broker's high-water mark (from its last "
            "fetch response) minus the next offset to read. A lower bound: a broker whose high-water marks "
            "under-report (Tansu, the embedded broker, does) shows less or 0; compare "
            "rate(jitterscope_streams_records_total) with the collectors' records_sent_total there")
CONSUMER_LAG = Gauge("jitterscope_streams_consumer_lag", LAG_HELP, ["topic", "partition"])
HIGHWATER = Gauge("jitterscope_streams_consumer_highwater",
                  "the broker's high-water mark of an assigned partition, as its last fetch response gave it",
                  ["topic", "partition"])
POSITION = Gauge("jitterscope_streams_consumer_position",
                 "next offset this worker reads in an assigned partition (last read + 1, or the committed offset)",
                 ["topic", "partition"])
_exported: set[tuple[str, str]] = set()


def partition_lag(highwater: int | None, last_read: int | None, committed: int | None) -> tuple[int | None, int | None]:
    """(next offset to read, lag) of one partition; None where unknown. The
    lag is never negative: an under-reporting broker's high-water mark may
    trail what was already read."""
    position = last_read + 1 if last_read is not None else committed
    if highwater is None or position is None:
        return position, None
    return position, max(0, highwater - position)


def refresh_consumer_lag(consumer) -> None:
    """Per assigned partition: position, high-water mark and lag, read at
    scrape time from Faust's consumer; series of partitions no longer
    assigned (a rebalance moved them) are removed, not left stale."""
    try:
        assigned = consumer.assignment()
    except Exception:  # not started yet, or mid-rebalance: the next scrape has them
        return
    current = set()
    for tp in assigned:
        labels = (tp.topic, str(tp.partition))
        try:
            highwater = consumer.highwater(tp)
        except Exception:  # no fetch response for it yet
            highwater = None
        position, lag = partition_lag(highwater, consumer._read_offset.get(tp), consumer._committed_offset.get(tp))
        for gauge, value in ((HIGHWATER, highwater), (POSITION, position), (CONSUMER_LAG, lag)):
            if value is not None:
                gauge.labels(*labels).set(value)
        current.add(labels)
    for labels in _exported - current:
        for gauge in (HIGHWATER, POSITION, CONSUMER_LAG):
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
    _exported.clear()
    _exported.update(current)


def authorization_error(header: str | None, token: str | None) -> tuple[int, str] | None:
    """(status, why) when ``header`` does not carry the worker's query token."""
    if not token:
        return 503, "the worker has not written its query token yet"
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return 401, "the query token is missing: use `jitterscope query` as the user that owns the store"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return 403, "wrong query token"
    return None


def add_routes(app: faust.App, worker, query: bool = True) -> None:
    """/metrics, and /query unless ``query`` is False (a stage without the store)."""
    if query:
        _add_query(app, worker)

    @app.page("/metrics")
    async def metrics(web, request: Request) -> Response:
        try:
            refresh_consumer_lag(app.consumer)
        except Exception:  # the lag is one family among many: /metrics answers without it
            pass
        return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


def _add_query(app: faust.App, worker) -> None:
    @app.page("/query")
    class Query(View):
        """POST {"sql": "...", "parameters": {...}} with `Authorization:
        Bearer <token>` -> {"columns": [...], "rows": [...]}, or the raw bytes
        of a query that ends in FORMAT <name>. Runs on a read-only client,
        after the read-only guard."""

        async def post(self, request: Request) -> Response:
            refused = authorization_error(request.headers.get("Authorization"), getattr(worker, "query_token", None))
            if refused:
                return self.json({"error": refused[1]}, status=refused[0])
            try:
                body = await request.json()
                sql, parameters = body["sql"], body.get("parameters") or {}
                readonly_sql.check(sql, parameters)
            except UnsafeQuery as exc:
                return self.json({"error": str(exc)}, status=400)
            except Exception as exc:  # not JSON, or no "sql"
                return self.json({"error": f"bad request: {exc!r}"}, status=400)
            try:
                if readonly_sql.output_format(sql):  # the query names its FORMAT: ClickHouse's bytes, as written
                    data = await worker.sink.run(lambda: readonly_sql.run_raw(worker.reader, sql, parameters))
                    return self.bytes(data, content_type="application/octet-stream")
                columns, rows = await worker.sink.run(lambda: readonly_sql.run(worker.reader, sql, parameters))
            except Exception as exc:
                return self.json({"error": str(exc)}, status=400)
            rows = json.loads(json.dumps(rows, default=values.plain))  # timestamps ISO 8601 UTC
            return self.json({"columns": columns, "rows": rows})
