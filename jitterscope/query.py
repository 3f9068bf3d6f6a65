"""Running read-only SQL for `jitterscope query`.

chDB allows one process per data directory, so while a streams worker runs it
answers for it over its local web port; otherwise the store is opened here,
read-only. A ClickHouse server is queried directly.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from jitterscope import errors
from jitterscope.settings import Settings
from jitterscope.streams import clickhouse
from jitterscope.streams.app import state_file


def running_worker_port(s: Settings) -> int | None:
    try:
        info = json.loads(state_file(s.data_dir).read_text())
        os.kill(info["pid"], 0)
    except (FileNotFoundError, ValueError, KeyError, ProcessLookupError, PermissionError):
        return None
    return int(info["port"])


def query_worker(port: int, sql: str, parameters: dict) -> tuple[list[str], list[list]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/query", data=json.dumps({"sql": sql, "parameters": parameters}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
        raise errors.JitterscopeError(f"query failed: {body.get('error', exc)}") from exc
    except urllib.error.URLError as exc:
        raise errors.ClickHouseUnavailable(
            f"the streams worker on port {port} did not answer ({exc.reason}); is it still starting?") from exc
    return body["columns"], body["rows"]


def run_query(s: Settings, sql: str, parameters: dict | None = None) -> tuple[list[str], list[list]]:
    parameters = parameters or {}
    if s.clickhouse_url is None and (port := running_worker_port(s)):
        return query_worker(port, sql, parameters)
    client = clickhouse.connect(s.clickhouse_url, s.data_dir, readonly=True)
    try:
        result = client.query(sql, parameters=parameters or None)
    except Exception as exc:
        raise errors.JitterscopeError(f"query failed: {exc}") from exc
    finally:
        client.close()  # releases the data directory for the worker
    return list(result.column_names), [list(r) for r in result.result_rows]
