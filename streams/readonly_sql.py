# SPDX-License-Identifier: Apache-2.0
"""A guard for user-typed SQL (`jitterscope query`, the worker's /query page):
it may only read the store.

Why a guard when the client already runs with ``readonly=1``: in embedded
chDB 26.9 (checked by hand, see tests/unit/streams/test_readonly_sql.py)
``readonly=1`` refuses DDL, INSERT, SET and table functions such as
``file()``/``url()``/``remote()``, but it does NOT refuse

- ``SELECT ... INTO OUTFILE '/path' [APPEND | TRUNCATE | AND STDOUT]``
  (also after SHOW and EXPLAIN PIPELINE): the engine runs in this process,
  so the server-side "client" writes the file with our privileges;
- the scalar function ``file('/etc/shadow')``, which returns any file's text;
- ``sqlite('/new/path', ...)``, which creates the file before it is refused;
- several statements in one string (``SELECT 1; SELECT 2`` runs both).

So the guard refuses, before anything runs: more than one statement, any
statement that does not start with SELECT/WITH/SHOW/DESCRIBE/DESC/EXISTS/
EXPLAIN (or a parenthesised SELECT), INTO OUTFILE, calls of functions that
reach files, URLs, other servers, other processes or AI providers, merge()
over the system database, and SETTINGS clauses. The read-only settings stay
as the last line of defence.

Two readings, so that the guard agrees with ClickHouse by construction:

1. ``check()``: our own tokens, offline, before anything is sent. String
   literals, quoted identifiers and comments are told apart the way
   ClickHouse's lexer does it (backslash escapes and doubled quotes inside
   quotes; ``--`` comments to the end of the line; ``/* */`` comments nest).
   Where ClickHouse has syntax this reading does not model (``//`` and ``#``
   comments, ``$$`` heredoc strings, backslashes or non-ASCII characters
   outside quotes), it refuses rather than guess: a guess that sees a string
   where ClickHouse sees code is a bypass (``SELECT 1 // '`` + newline +
   ``, file('/etc/hostname') -- '`` read a file when ``//`` was not known).
2. ``run()``/``run_raw()``, on the client that will run the query: ClickHouse's
   own parser reads the text first (``formatQuerySingleLine``, with the text
   sent as a typed parameter, so it is parsed and never run). It refuses more
   than one statement, and what comes back is the statement as ClickHouse
   understood it, with every comment gone and every literal in one canonical
   quoting. The same checks then run on that text, where no lexer trick is
   left to disagree about. The text run is the user's own, unchanged.

Parameters are checked after binding. clickhouse-connect fills ``%(name)s``
markers in by text, and a value placed inside a string literal ends the
literal: ``SELECT 1, '%(x)s/tmp/f'`` with x = ``INTO OUTFILE`` writes /tmp/f.
So the guard checks exactly the text clickhouse-connect will send.

``{name:Identifier}`` parameters are names, not values: ClickHouse puts them
into the statement as a table, database or column, so ``FROM
{d:Identifier}.{t:Identifier}`` with d=system, t=named_collections reads the
credentials while the text names neither. Both readings therefore run on the
text with every Identifier value written in place, and a value may only be a
plain name or ``database.name``.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from jitterscope.common.errors import UnsafeQuery

#: the words a read-only statement may start with
READ_STATEMENTS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})

#: EXPLAIN kinds (EXPLAIN PIPELINE of an INSERT builds its sink: it creates the file)
EXPLAIN_KINDS = frozenset({"AST", "SYNTAX", "QUERY", "TREE", "PLAN", "PIPELINE", "ESTIMATE"})

#: Functions (table or scalar) that reach files, URLs, other servers, other
#: processes or this Python process, or whose safety is not plain. Compared in
#: lower case. Every table function chDB knows is either here or in
#: SAFE_TABLE_FUNCTIONS (a unit test checks that against the running chDB).
DENIED_FUNCTIONS = frozenset(name.lower() for name in (
    # local files (file() is also a scalar function that returns a file's text)
    "file", "fileCluster", "filesystem", "sqlite", "input", "catboostEvaluate", "naiveBayesClassifier",
    # URLs and object stores
    "url", "urlCluster", "s3", "s3Cluster", "gcs", "oss", "cosn", "hdfs", "hdfsCluster",
    "azureBlobStorage", "azureBlobStorageCluster",
    # data lakes (any storage)
    "iceberg", "icebergS3", "icebergAzure", "icebergHDFS", "icebergLocal", "icebergCluster",
    "icebergS3Cluster", "icebergAzureCluster", "icebergHDFSCluster", "icebergLocalCluster",
    "deltaLake", "deltaLakeS3", "deltaLakeAzure", "deltaLakeLocal", "deltaLakeCluster",
    "deltaLakeS3Cluster", "deltaLakeAzureCluster", "hudi", "hudiCluster",
    "paimon", "paimonS3", "paimonAzure", "paimonHDFS", "paimonLocal", "paimonCluster",
    "paimonS3Cluster", "paimonAzureCluster", "paimonHDFSCluster", "paimonLocalCluster",
    # other servers and databases
    "remote", "remoteSecure", "cluster", "clusterAllReplicas", "mysql", "postgresql", "odbc", "jdbc",
    "mongodb", "redis", "ytsaurus", "bigquery", "arrowflight", "dictionary", "generateSerialID",
    # processes, and chDB's access to this Python process's objects
    "executable", "executablePool", "python", "arrowstream", "eval",
    # not needed here and not plainly local and read-only
    "viewExplain", "fuzzJSON", "fuzzQuery", "prometheusQuery", "prometheusQueryRange",
    "timeSeriesData", "timeSeriesMetricFamilies", "timeSeriesMetrics", "timeSeriesSamples",
    "timeSeriesSelector", "timeSeriesTags",
    # scalar functions that send data to an LLM provider over the network
    "aiClassify", "aiEmbed", "aiExtract", "aiFilter", "aiGenerate", "aiRedact", "aiSimilarity", "aiTranslate",
))

#: system.functions categories whose every member must be denied (a unit test
#: checks this against the running chDB, so a new AI function is caught)
DENIED_FUNCTION_CATEGORIES = frozenset({"AI"})

#: table functions reviewed as local and read-only
SAFE_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "primes", "generateRandom", "generateSeries",
    "generate_series", "values", "SQLStandardValues", "format", "null", "view", "viewIfPermitted", "loop",
    "merge", "mergeTreeIndex", "mergeTreeProjection", "mergeTreeAnalyzeIndexes",
    "mergeTreeAnalyzeIndexesUUID", "mergeTreeCodecBlockCounts", "mergeTreeTextIndex",
})

#: system tables that hold secrets (credentials of external sources)
DENIED_SYSTEM_TABLES = frozenset({"named_collections"})

#: databases merge() may not read: it reaches every table of one, secrets too
SYSTEM_DATABASES = frozenset({"system", "information_schema"})

#: ``{name:Identifier}`` markers, spelled loosely on purpose: a marker
#: ClickHouse would reject costs a refusal, one it accepts and this misses
#: would be a bypass
IDENTIFIER_MARKER = re.compile(r"\{\s*([^{}:\s]+)\s*:\s*Identifier\s*\}")

#: what an Identifier parameter may hold: a name or database.name. Such a value
#: is inert wherever it lands (in a literal or a comment too), so every
#: marker can be replaced without knowing which ones ClickHouse will fill in.
IDENTIFIER_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")

WHITESPACE = " \t\n\r\f\v"
PUNCTUATION = "()[]{},;.:+-*/%<>=!|?^&~@"


class Token(NamedTuple):
    kind: str  # "word", "quoted" (identifier in "" or ``), "string" or "punct"
    text: str  # words: as written; quoted: the name inside; strings: the literal as written


def _is_word_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def _end_of_quoted(sql: str, start: int) -> int:
    """Index just past the quoted token opening at ``start``. As in ClickHouse,
    a backslash escapes the next character and a doubled quote is a quote."""
    quote, i = sql[start], start + 1
    while i < len(sql):
        if sql[i] == "\\":
            i += 2
        elif sql[i] == quote:
            if sql.startswith(quote, i + 1):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise UnsafeQuery(f"refused: unterminated {quote}-quoted text at position {start}")


def _end_of_block_comment(sql: str, start: int) -> int:
    """Index just past the /* */ comment at ``start``; they nest in ClickHouse."""
    depth, i = 0, start
    while i < len(sql):
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise UnsafeQuery(f"refused: unterminated /* comment at position {start}")


def tokenize(sql: str) -> list[Token]:
    """Tokens of ``sql`` without whitespace and comments."""
    tokens: list[Token] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in WHITESPACE:
            i += 1
        elif sql.startswith("--", i):  # to the end of the line; ClickHouse does not stop at \r
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            i = _end_of_block_comment(sql, i)
        elif c in "'\"`":
            end = _end_of_quoted(sql, i)
            if c == "'":
                tokens.append(Token("string", sql[i:end]))
            else:
                name = sql[i + 1:end - 1]
                if "\\" in name:  # escapes such as \x66 could spell a denied name
                    raise UnsafeQuery(f"refused: backslash in quoted identifier {sql[i:end]}")
                tokens.append(Token("quoted", name.replace(c + c, c)))
            i = end
        elif _is_word_char(c):
            end = i + 1
            while end < n and (_is_word_char(sql[end]) or sql[end] == "$"):  # a$b is one identifier
                end += 1
            tokens.append(Token("word", sql[i:end]))
            i = end
        elif c in PUNCTUATION and not sql.startswith("//", i):  # // is a comment to ClickHouse
            tokens.append(Token("punct", c))
            i += 1
        else:
            why = {"$": "dollar-quoted strings are not supported, use '...'",
                   "/": "// comments are not supported, use --",
                   "#": "# comments are not supported, use --"}.get(c, "not valid outside quotes")
            raise UnsafeQuery(f"refused: character {c!r} at position {i}: {why}")
    return tokens


def _is(token: Token | None, *words: str) -> bool:
    return token is not None and token.kind == "word" and token.text.upper() in words


def _statements(tokens: list[Token]) -> list[list[Token]]:
    statements: list[list[Token]] = []
    current: list[Token] = []
    for token in tokens:
        if token == Token("punct", ";"):
            statements.append(current)
            current = []
        else:
            current.append(token)
    statements.append(current)
    return [s for s in statements if s]


def _check_explain(statement: list[Token]) -> None:
    """EXPLAIN [kind] [name = value, ...] must be followed by a SELECT."""
    i = 1
    while i < len(statement):
        token = statement[i]
        if _is(token, "SELECT", "WITH") or token == Token("punct", "("):
            return
        if _is(token, *EXPLAIN_KINDS) or token == Token("punct", ","):
            i += 1
        elif token.kind == "word" and statement[i + 1:i + 2] == [Token("punct", "=")]:
            i += 3  # an EXPLAIN setting: name = value
        else:
            break
    raise UnsafeQuery("refused: EXPLAIN may only explain a SELECT")


def _check_merge(arguments: list[Token]) -> None:
    """merge(database, tables_regexp) reads every matching table of one
    database: only a database named by a plain literal, never a system one
    (``merge('system', '^named_collections$')`` reads the credentials)."""
    database = arguments[0] if arguments else None
    named = (database is not None and database.kind == "string" and arguments[1:2] == [Token("punct", ",")]
             and "\\" not in database.text)
    if database is None or not named or database.text[1:-1].replace("''", "'").lower() in SYSTEM_DATABASES:
        raise UnsafeQuery("refused: merge() may only name a database of tables as a plain literal, "
                          "and not a system one: merge('jitterscope', '^runq')")


def check_sql(sql: str) -> None:
    """Raise UnsafeQuery unless ``sql`` is one statement that only reads."""
    statements = _statements(tokenize(sql))
    if not statements:
        raise UnsafeQuery("refused: the query is empty")
    if len(statements) > 1:
        raise UnsafeQuery("refused: more than one statement; send one query at a time")
    statement = statements[0]
    first = next((t for t in statement if t != Token("punct", "(")), None)
    parenthesised = first is not statement[0]
    if not _is(first, *READ_STATEMENTS) or (parenthesised and not _is(first, "SELECT", "WITH")):
        shown = first.text if first else "("
        raise UnsafeQuery(f"refused: {shown!r} statements are not allowed; "
                          "only SELECT, WITH, SHOW, DESCRIBE, EXISTS and EXPLAIN may run")
    if _is(first, "EXPLAIN"):
        _check_explain(statement)
    for i, token in enumerate(statement):
        after = statement[i + 1] if i + 1 < len(statement) else None
        if _is(token, "INTO") and _is(after, "OUTFILE"):
            raise UnsafeQuery("refused: INTO OUTFILE writes a file on the machine that runs the query")
        if token.kind in ("word", "quoted") and after == Token("punct", "("):
            if token.kind == "quoted":
                raise UnsafeQuery(f"refused: quoted function name `{token.text}`; write function names plainly")
            if token.text.lower() in DENIED_FUNCTIONS:
                raise UnsafeQuery(f"refused: {token.text}() reaches files, URLs, other servers or processes")
            if token.text.lower() == "merge":
                _check_merge(statement[i + 2:])
        if (_is(token, "SETTINGS") and after is not None and after.kind in ("word", "quoted")
                and statement[i + 2:i + 3] == [Token("punct", "=")]):  # not a column named settings
            raise UnsafeQuery("refused: SETTINGS clauses are not allowed; query limits are fixed by jitterscope")
        if (token.kind in ("word", "quoted") and token.text.lower() == "system"
                and after == Token("punct", ".") and i + 2 < len(statement)
                and statement[i + 2].text.lower() in DENIED_SYSTEM_TABLES):
            raise UnsafeQuery(f"refused: system.{statement[i + 2].text} holds credentials")


def output_format(sql: str) -> str | None:
    """The format a query names itself (``... FORMAT TSV``), else None. Only
    a trailing clause counts: ``format(...)`` is a table function, and a
    FORMAT clause cannot be followed by anything the guard allows. Call
    after ``check``."""
    statements = _statements(tokenize(sql))
    last = statements[-1] if statements else []
    if len(last) >= 3 and _is(last[-2], "FORMAT") and last[-1].kind in ("word", "quoted"):
        return last[-1].text
    return None


def parsed(client, sql: str) -> str:
    """``sql`` as ClickHouse's own parser reads it, on ``client``'s engine:
    one statement, canonical text, comments gone. The text goes as a typed
    parameter, so it is parsed and never run. UnsafeQuery when ClickHouse
    does not read it as exactly one statement."""
    try:
        result = client.query("SELECT formatQuerySingleLine({q:String})", parameters={"q": sql})
    except Exception as exc:
        why = " ".join(str(exc).split())
        why = why.split("DB::Exception: ", 1)[-1].split(": In scope SELECT formatQuery", 1)[0]
        raise UnsafeQuery(f"refused: ClickHouse does not read this as one statement: {why[:300]}") from exc
    return result.result_rows[0][0]


def check_with_engine(client, sql: str, parameters: dict | None = None) -> None:
    """``check``, then the same rules on ClickHouse's own reading of the text
    that will be sent. Every path that runs user SQL calls this."""
    check(sql, parameters)
    # ClickHouse's canonical text keeps {name:Identifier} markers: fill them in before the rules run
    canonical = with_identifiers(parsed(client, bound_sql(sql, parameters)), parameters)
    try:
        check_sql(canonical)
    except UnsafeQuery as exc:
        raise UnsafeQuery(f"{exc} (as ClickHouse reads it: {canonical[:200]})") from exc


def run_raw(client, sql: str, parameters: dict | None = None) -> bytes:
    """ClickHouse's own bytes for checked ``sql`` that names its FORMAT."""
    check_with_engine(client, sql, parameters)
    return client.raw_query(sql, parameters=parameters or None)


def run(client, sql: str, parameters: dict | None = None) -> tuple[list[str], list[list]]:
    """(columns, rows) of checked ``sql`` on a read-only client.
    clickhouse-connect reports no columns for an empty result, so their
    names are asked for again then: an empty answer still has its header."""
    check_with_engine(client, sql, parameters)
    result = client.query(sql, parameters=parameters or None)
    columns, rows = list(result.column_names), [list(r) for r in result.result_rows]
    if not rows and not columns:
        names = client.raw_query(sql, parameters=parameters or None, fmt="JSONCompactEachRowWithNames")
        first = names.split(b"\n", 1)[0].strip()
        columns = json.loads(first) if first else []
    return columns, rows


def bound_sql(sql: str, parameters: dict | None) -> str:
    """The text clickhouse-connect will send for ``sql`` with ``parameters``
    (``%(name)s`` markers are filled in by text; ``{name:Type}`` markers go
    to the server as typed values and stay in the text)."""
    if not parameters:
        return sql
    if not isinstance(parameters, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in parameters.items()):
        raise UnsafeQuery("refused: parameters must map names to strings or numbers")
    from clickhouse_connect.driver.binding import bind_query

    try:
        text, _server_side = bind_query(sql, parameters)
    except Exception as exc:  # the binder rejects malformed markers
        raise UnsafeQuery(f"refused: cannot bind the parameters: {exc}") from exc
    if not isinstance(text, str):
        raise UnsafeQuery("refused: binary parameters are not allowed")
    return text


def check(sql: str, parameters: dict | None = None) -> None:
    """Raise UnsafeQuery unless ``sql``, as it will run with ``parameters``,
    is one statement that only reads."""
    if not isinstance(sql, str):
        raise UnsafeQuery("refused: the query must be text")
    if "\0" in sql:
        raise UnsafeQuery("refused: NUL character in the query")
    bound = bound_sql(sql, parameters)
    named = with_identifiers(bound, parameters)
    try:
        check_sql(named)
    except UnsafeQuery as exc:
        if named == bound:
            raise
        raise UnsafeQuery(f"{exc} (with the {{name:Identifier}} parameters in place)") from exc


def with_identifiers(sql: str, parameters: dict | None) -> str:
    """``sql`` with each ``{name:Identifier}`` marker replaced by its value,
    so that the rules see the names ClickHouse will use."""
    def value(marker: re.Match) -> str:
        name = marker.group(1)
        given = (parameters or {}).get(name)
        if given is None:
            raise UnsafeQuery(f"refused: {marker.group(0)} has no value; pass it as a parameter "
                              f"(jitterscope query --param {name}=jitterscope.alerts)")
        if not isinstance(given, str) or not IDENTIFIER_VALUE.fullmatch(given):
            raise UnsafeQuery(f"refused: Identifier parameter {name}={str(given)[:80]!r} is not a plain name; "
                              "give a name or database.name of letters, digits and _, such as jitterscope.alerts")
        return given
    return IDENTIFIER_MARKER.sub(value, sql)
