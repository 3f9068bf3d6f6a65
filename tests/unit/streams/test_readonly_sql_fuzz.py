# SPDX-License-Identifier: Apache-2.0
"""Differential fuzz of the read-only SQL guard against ClickHouse itself.

Ten thousand queries from a seeded generator (a failure replays): ordinary
reads and known attack shapes, mutated with every comment and quote form
ClickHouse's lexer knows (``//``, ``--``, ``#``, nested ``/* */``, ``$$``
heredocs, backslashes, doubled quotes, Unicode line breaks) and with payloads
that would read a file, write one, run a second statement or lift the
read-only settings.

The guard's verdict is not trusted: every query it accepts is judged again
by an oracle that shares none of its code, on a throwaway chDB:

- ``EXPLAIN AST`` of it is one statement of an allowed kind (a SELECT, SHOW,
  DESCRIBE, EXISTS or EXPLAIN of a SELECT), and calls no denied function
  (compared with the AST's own function names);
- it is then run read-only, and afterwards the canary file's secret appears
  in no answer, and the directory the payloads aim at is still empty.
"""

from __future__ import annotations

import random
import re

import pytest

from jitterscope.common.errors import UnsafeQuery
from jitterscope.streams import readonly_sql

SEED = 20261201
CASES = 10_000  # ~15 s on an idle 2-core VM: most are refused before the engine

SECRET = "jitterscope-canary-7f3a"

#: the top AST node of each statement kind the guard may let through
ALLOWED_ROOTS = ("SelectWithUnionQuery ", "SelectIntersectExceptQuery ", "ShowTables ", "ShowCreate",
                 "DescribeQuery ", "Exists", "Explain ")

SEEDS = [
    "SELECT 1",
    "SELECT number, number * 2 AS twice FROM numbers(5) WHERE number % 2 = 0 ORDER BY number DESC",
    "WITH t AS (SELECT number FROM numbers(3)) SELECT count() FROM t",
    "SELECT 'a // b', 'c -- d', 'e # f', 'g /* h */' AS s",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SHOW TABLES FROM system",
    "DESCRIBE TABLE system.one",
    "EXISTS TABLE system.one",
    "EXPLAIN SELECT 1",
    "SELECT name FROM system.databases WHERE name = {db:String}",
    "SELECT 'it''s', 'back\\\\slash', \"dummy\" FROM system.one",
    "SELECT count() FROM merge('system', '^one$')",
    "SELECT 1 // '\n, 2 -- '",
]

COMMENT_AND_QUOTE_FORMS = [
    "//", "// '", "--", "-- '", "#", "# '", "#!", "/*", "*/", "/* /* */", "/* ' */", "*/ '", "$$", "$$ '",
    "$tag$", "\\", "\\'", "'", "''", '"', "`", "\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "\v", "\f",
    "\t", ";", " ", "\u00a0", "\ufeff",
]


def payloads(canary: str, outdir: str) -> list[str]:
    return [
        f", file('{canary}') AS leaked",
        f" UNION ALL SELECT file('{canary}')",
        f" FROM file('{canary}', 'LineAsString')",
        f" INTO OUTFILE '{outdir}/written'",
        f" INTO OUTFILE '{outdir}/written' TRUNCATE FORMAT RawBLOB",
        f"; SELECT 'x' INTO OUTFILE '{outdir}/second' TRUNCATE FORMAT RawBLOB; SELECT 2",
        " SETTINGS readonly = 0",
        "; SET readonly = 0",
        "; DROP TABLE IF EXISTS default.nothing",
        f", (SELECT * FROM sqlite('{outdir}/created.db', 't'))",
        " FROM url('http://127.0.0.1:9/', 'LineAsString')",
        ", * FROM merge('system', '^named_collections$')",
        f" FROM executable('cat {canary}', 'LineAsString', 'x String')",
        ", aiGenerate('x')",
    ]


def mutate(rng: random.Random, query: str, extras: list[str]) -> str:
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(query))
        op = rng.random()
        if op < 0.45:
            query = query[:at] + rng.choice(COMMENT_AND_QUOTE_FORMS) + query[at:]
        elif op < 0.75:
            query = query[:at] + rng.choice(extras) + query[at:]
        elif op < 0.9:  # a comment form that hides a payload on the next line from a naive lexer
            form = rng.choice(COMMENT_AND_QUOTE_FORMS)
            query = (query[:at] + f" {form} '" + rng.choice(["\n", "\r", "\u2028", "\r\n"])
                     + rng.choice(extras) + " -- '" + query[at:])
        elif len(query) > 1:
            end = rng.randint(at, min(len(query), at + 8))
            query = query[:at] + query[end:]
    return query


def ast_of(client, sql: str, parameters: dict | None) -> list[str]:
    return [row[0] for row in client.query(f"EXPLAIN AST {sql}", parameters=parameters).result_rows]


def functions_in(ast: list[str]) -> set[str]:
    return {m.group(1).lower() for line in ast if (m := re.match(r"\s*(?:Table)?Function (\w+)", line))}


@pytest.fixture
def sandbox(tmp_path):
    import clickhouse_connect

    canary = tmp_path / "canary.txt"
    canary.write_text(SECRET + "\n")
    outdir = tmp_path / "out"
    outdir.mkdir()
    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "ch"), settings={"readonly": 1})
    yield client, str(canary), outdir
    client.close()


@pytest.mark.parametrize("layer", ["whole guard", "engine reading alone"])
def test_every_query_the_guard_accepts_is_one_harmless_read(sandbox, layer, monkeypatch):
    """Twice: the whole guard, then ClickHouse's reading with our own tokens
    blinded, so that each layer is shown to hold by itself (our tokens
    refuse most odd shapes early, which would hide a weak second layer)."""
    client, canary, outdir = sandbox
    if layer == "engine reading alone":
        monkeypatch.setattr(readonly_sql, "check", lambda sql, parameters=None: None)
    extras = payloads(canary, str(outdir))
    attack_seeds = [f"SELECT 1 {form} '\n{extra} -- '" for form in ("//", "#", "--", "/*") for extra in extras]
    rng = random.Random(SEED)
    accepted = refused_by_tokens = refused_by_engine = unexplained = 0
    for case in range(CASES):
        sql = mutate(rng, rng.choice(SEEDS + attack_seeds), extras)
        parameters = {"db": "system"} if "{db:" in sql else None
        try:
            readonly_sql.check(sql, parameters)  # blinded in the second run
        except UnsafeQuery:
            refused_by_tokens += 1
            continue
        try:
            readonly_sql.check_with_engine(client, sql, parameters)
        except UnsafeQuery:
            refused_by_engine += 1
            continue
        accepted += 1
        try:
            ast = ast_of(client, sql, parameters)
        except Exception:  # chDB reads a bare expression ("EXP--LAIN ...") as an implicit SELECT, which
            # EXPLAIN AST cannot explain; the run below judges those
            unexplained += 1
        else:
            assert ast and ast[0].startswith(ALLOWED_ROOTS), (case, sql, ast[:3])
            denied = functions_in(ast) & readonly_sql.DENIED_FUNCTIONS
            assert not denied, (case, sql, denied)
        try:
            answer = client.raw_query(sql, parameters=parameters)
        except Exception:  # an accepted query may still fail to run (a type error): it ran nothing
            answer = b""
        assert SECRET.encode() not in answer, (case, sql)
        assert not list(outdir.iterdir()), (case, sql)
    # the run exercised all three outcomes, or it proved nothing
    assert accepted > 100 and refused_by_engine > 50, (accepted, refused_by_tokens, refused_by_engine)
    assert (refused_by_tokens > 1000) == (layer == "whole guard"), refused_by_tokens
    assert unexplained < accepted / 3, (unexplained, accepted)
