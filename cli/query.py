# SPDX-License-Identifier: Apache-2.0
"""Running read-only SQL for `jitterscope query`.

chDB allows one process per data directory, so while a streams worker runs it
answers for it over its local web port; otherwise the store is opened here,
read-only. A ClickHouse server is queried directly.

User SQL passes the read-only guard (streams/readonly_sql.py) before it goes
anywhere. The worker's /query page wants the token the worker wrote into its
state file (mode 0600), so only users who may read the store may query it.

A query that ends in ClickHouse's own ``FORMAT <name>`` gets ClickHouse's
bytes (``run_raw``); the rest come back as columns and rows for `jitterscope
query -f ...` to print. A store with no database yet is ``NoData``, which
says how to get some.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

from jitterscope.common import errors, outbound
from jitterscope.common.masking import mask_url
from jitterscope.common.settings import Settings
from jitterscope.streams import clickhouse, readonly_sql
from jitterscope.streams.worker_state import state_file

UNSET_PARAMETER = re.compile(r"Substitution [`'\"]?(\w+)[`'\"]? is not set")


class Worker(NamedTuple):
    """How to reach a running streams worker's /query page."""

    port: int
    token: str
    bind: str = "127.0.0.1"  # the worker's streams_web_bind

    @property
    def url(self) -> str:
        return f"http://{dial_host(self.bind)}:{self.port}"


def dial_host(bind: str) -> str:
    """Where to reach a server bound to ``bind``: a wildcard bind answers on loopback."""
    if bind in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{bind}]" if ":" in bind else bind


def _not_yours(path: Path, how: str = "read", why: str = "") -> errors.NotPrivileged:
    return errors.NotPrivileged(f"you cannot {how} {path}{why}: run as the user that owns the store (root?)")


def no_data(s: Settings) -> errors.NoData:
    url = mask_url(s.clickhouse_url or "")  # never print the password
    where = url or s.data_dir / "clickhouse"
    how = (f"start 'jitterscope streams --clickhouse-url {url}' (it creates the tables)"
           if s.clickhouse_url else
           f"run 'jitterscope up --data-dir {s.data_dir}' to collect some, or 'jitterscope synthetic-fleet "
           f"--data-dir {s.data_dir}' to load a sample fleet")
    return errors.NoData(f"no data yet: {where} has no {clickhouse.DATABASE} database; {how}")


def running_worker(s: Settings) -> Worker | None:
    path = state_file(s.data_dir)
    try:
        info = json.loads(path.read_text())
        pid, port, token = int(info["pid"]), int(info["port"]), str(info.get("token", ""))
        bind = str(info.get("bind", "127.0.0.1"))
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise _not_yours(path) from exc
    except (ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # left behind by a worker that died
    except PermissionError:
        pass  # alive, run by another user
    return Worker(port, token, bind)


def running_worker_port(s: Settings) -> int | None:
    worker = running_worker(s)
    return worker.port if worker else None


# The request carries the worker's /query token. The worker is found through
# the state file in this host's data directory, so it runs here and its
# address is one the user configured (streams_web_bind: loopback or this
# host's own address): no proxy, whatever http_proxy says (a proxy would see
# the token, and cannot reach the worker's loopback), and a redirect is
# refused, never followed with the token.
WORKER_HTTP = outbound.opener(proxies=False)


def query_worker(worker: Worker, sql: str, parameters: dict, raw: bool = False):
    """The worker's answer: (columns, rows), or with ``raw`` the bytes of a
    query that names its own FORMAT."""
    request = urllib.request.Request(
        f"{worker.url}/query",
        data=json.dumps({"sql": sql, "parameters": parameters}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {worker.token}"}, method="POST")
    try:
        with WORKER_HTTP.open(request, timeout=120) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read() or b"{}").get("error", exc)
        except ValueError:
            error = exc
        if exc.code in (401, 403):
            raise errors.NotPrivileged(
                f"the streams worker on port {worker.port} refused the query token: {error}") from exc
        raise errors.JitterscopeError(f"query failed: {error}") from exc
    except urllib.error.URLError as exc:
        raise errors.ClickHouseUnavailable(
            f"the streams worker on port {worker.port} did not answer ({exc.reason}); is it still starting?") from exc
    if raw:
        return data
    body = json.loads(data)
    return body["columns"], body["rows"]


def _run(s: Settings, sql: str, parameters: dict | None, raw: bool):
    parameters = parameters or {}
    readonly_sql.check(sql, parameters)
    data_dir, scratch = s.data_dir, None
    if s.clickhouse_url is None:
        if worker := running_worker(s):
            return query_worker(worker, sql, parameters, raw)
        store = s.data_dir / "clickhouse"
        try:
            os.listdir(store)
        except FileNotFoundError:  # no store there (a mistyped --data-dir?): an empty one that leaves nothing behind
            scratch = tempfile.TemporaryDirectory(prefix="jitterscope-no-store-")
            data_dir = Path(scratch.name)
        except PermissionError as exc:  # say so, rather than chDB's "cannot lock"
            raise _not_yours(store) from exc
        else:
            if not os.access(store, os.W_OK):  # chDB locks the store: readable is not enough
                raise _not_yours(store, "write to", " (chDB locks the store even to read it)")
    client = clickhouse.connect(s.clickhouse_url, data_dir, readonly=True)
    try:
        if raw:
            return readonly_sql.run_raw(client, sql, parameters)
        return readonly_sql.run(client, sql, parameters)
    except Exception as exc:
        if "UNKNOWN_DATABASE" in str(exc) and f"Database {clickhouse.DATABASE} " in str(exc):
            raise no_data(s) from exc
        if unset := UNSET_PARAMETER.search(str(exc)):  # ClickHouse's words name no option
            raise errors.BadConfig(f"the query has a parameter {{{unset[1]}:...}} with no value: give it one "
                                   f"with -p {unset[1]}=VALUE") from exc
        raise errors.JitterscopeError(f"query failed: {exc}") from exc
    finally:
        client.close()  # releases the data directory for the worker
        if scratch:
            scratch.cleanup()


def run_query(s: Settings, sql: str, parameters: dict | None = None) -> tuple[list[str], list[list]]:
    """(columns, rows) of read-only ``sql``; NoData while the store has no database."""
    return _run(s, sql, parameters, raw=False)


def run_raw(s: Settings, sql: str, parameters: dict | None = None) -> bytes:
    """ClickHouse's own bytes for read-only ``sql`` that ends in FORMAT <name>."""
    return _run(s, sql, parameters, raw=True)
