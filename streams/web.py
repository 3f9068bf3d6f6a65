"""The streams worker's web pages: /metrics for Prometheus and /query, which
answers `jitterscope query` while this process holds the embedded store."""

from __future__ import annotations

import json

import faust
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def add_routes(app: faust.App, worker) -> None:
    @app.page("/query")
    class Query(View):
        """POST {"sql": "...", "parameters": {...}} -> {"columns": [...], "rows": [...]}
        Runs on a read-only client: user SQL cannot change the store."""

        async def post(self, request: Request) -> Response:
            body = await request.json()
            try:
                result = await worker.sink.run(
                    lambda: worker.reader.query(body["sql"], parameters=body.get("parameters") or None))
            except Exception as exc:
                return self.json({"error": str(exc)}, status=400)
            rows = json.loads(json.dumps(result.result_rows, default=str))
            return self.json({"columns": list(result.column_names), "rows": rows})

    @app.page("/metrics")
    async def metrics(web, request: Request) -> Response:
        return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])
