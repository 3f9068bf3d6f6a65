"""The streams worker's web pages: /metrics for Prometheus and /query, which
answers `jitterscope query` while this process holds the embedded store.

/query runs user SQL, so it asks for two things: the bearer token the worker
wrote into its state file (mode 0600: only the store's owner can read it,
while the port is open to every local user), and SQL that passes the
read-only guard. /metrics stays open."""

from __future__ import annotations

import hmac
import json

import faust
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from jitterscope.common import values
from jitterscope.common.errors import UnsafeQuery
from jitterscope.streams import readonly_sql


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


def add_routes(app: faust.App, worker) -> None:
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
                    data = await worker.sink.run(lambda: worker.reader.raw_query(sql, parameters=parameters or None))
                    return self.bytes(data, content_type="application/octet-stream")
                columns, rows = await worker.sink.run(lambda: readonly_sql.run(worker.reader, sql, parameters))
            except Exception as exc:
                return self.json({"error": str(exc)}, status=400)
            rows = json.loads(json.dumps(rows, default=values.plain))  # timestamps ISO 8601 UTC
            return self.json({"columns": columns, "rows": rows})

    @app.page("/metrics")
    async def metrics(web, request: Request) -> Response:
        return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])
