# SPDX-License-Identifier: Apache-2.0
"""The read-only guard for user SQL: one test per attack, and the ordinary
queries it must let through."""

from __future__ import annotations

from pathlib import Path

import pytest

from jitterscope.common.errors import JitterscopeError, UnsafeQuery
from jitterscope.streams import readonly_sql
from jitterscope.streams.readonly_sql import check


def refused(sql: str, parameters: dict | None = None) -> str:
    with pytest.raises(UnsafeQuery) as info:
        check(sql, parameters)
    message = str(info.value)
    assert "\n" not in message and message.startswith("refused: ")
    return message


@pytest.mark.parametrize("sql", [
    "SELECT 'x' INTO OUTFILE '/root/secret/new'",
    "SELECT 'x' INTO OUTFILE '/root/victim' APPEND",
    "SELECT 'x' INTO OUTFILE '/root/victim' TRUNCATE",
    "SELECT 'x' INTO OUTFILE '/root/victim' AND STDOUT",
    "sEleCt 'x' /* */ into/**/outfile '/tmp/f'",
    "select 1 INTO -- comment\n OUTFILE '/tmp/f'",
    "SHOW TABLES INTO OUTFILE '/tmp/f'",
    "EXPLAIN PIPELINE SELECT 1 INTO OUTFILE '/tmp/f'",
    "WITH t AS (SELECT 1) SELECT * FROM t INTO OUTFILE '/tmp/f'",
    "(SELECT 1) INTO OUTFILE '/tmp/f'",
])
def test_into_outfile_is_refused(sql):
    assert "INTO OUTFILE" in refused(sql)


@pytest.mark.parametrize("sql, name", [
    ("SELECT * FROM file('/etc/shadow', 'LineAsString')", "file"),
    ("SELECT file('/etc/shadow')", "file"),  # the scalar file() reads any file under readonly=1
    ("SELECT * FROM url('http://169.254.169.254/', 'LineAsString')", "url"),
    ("SELECT * FROM s3('http://127.0.0.1/b/x.csv', 'CSV', 'a String')", "s3"),
    ("SELECT * FROM executable('id', 'LineAsString', 'a String')", "executable"),
    ("SELECT * FROM remote('127.0.0.1:9000', system.one)", "remote"),
    ("SELECT * FROM sqlite('/root/new.db', 't')", "sqlite"),
    ("SELECT * FROM mysql('h:3306', 'd', 't', 'u', 'p')", "mysql"),
    ("SELECT * FROM postgresql('h:5432', 'd', 't', 'u', 'p')", "postgresql"),
    ("SELECT * FROM hdfs('hdfs://h/x', 'CSV', 'a String')", "hdfs"),
    ("SELECT * FROM azureBlobStorage('x')", "azureBlobStorage"),
    ("SELECT * FROM icebergLocal('/var/lib')", "icebergLocal"),
    ("SELECT * FROM deltaLake('http://h/x')", "deltaLake"),
    ("SELECT * FROM clusterAllReplicas('c', system.one)", "clusterAllReplicas"),
    ("SELECT * FROM dictionary('d')", "dictionary"),
    ("SELECT * FROM python(df)", "python"),
    ("SELECT * FROM FILE('/etc/shadow', 'LineAsString')", "FILE"),
    ("SELECT * FROM file /* gap */ ('/etc/shadow', 'LineAsString')", "file"),
    ("SELECT count() FROM (SELECT * FROM jitterscope.processes WHERE pid IN "
     "(SELECT toUInt32(line) FROM file('/tmp/pids', 'LineAsString')))", "file"),
    ("DESCRIBE TABLE file('/etc/shadow', 'LineAsString')", "file"),
    ("SELECT * FROM loop(url('http://h/', 'CSV', 'a String')) LIMIT 1", "url"),
])
def test_functions_that_reach_outside_are_refused(sql, name):
    assert f"{name}()" in refused(sql)


def test_quoted_function_names_are_refused():
    refused("SELECT * FROM `file`('/etc/shadow', 'LineAsString')")
    refused('SELECT * FROM "fi\\x6ce"(\'/etc/shadow\')')


@pytest.mark.parametrize("sql", [
    "INSERT INTO FUNCTION file('/tmp/f', 'CSV') SELECT 1",
    "INSERT INTO jitterscope.alerts SELECT * FROM jitterscope.alerts",
    "CREATE TABLE t (a Int8) ENGINE = File(CSV, '/tmp/f')",
    "ALTER TABLE jitterscope.processes DELETE WHERE 1",
    "DROP TABLE jitterscope.processes",
    "TRUNCATE TABLE jitterscope.processes",
    "DELETE FROM jitterscope.processes WHERE 1",
    "SYSTEM FLUSH LOGS",
    "KILL QUERY WHERE 1",
    "SET readonly = 0",
    "GRANT ALL ON *.* TO default",
    "BACKUP DATABASE jitterscope TO File('/tmp/b')",
    "OPTIMIZE TABLE jitterscope.processes FINAL",
    "USE system",
    "(INSERT INTO t VALUES (1))",
    "(SHOW TABLES)",
    "WITH 1 AS x INSERT INTO FUNCTION file('/tmp/f', 'CSV') SELECT x",
])
def test_statements_that_write_are_refused(sql):
    refused(sql)


@pytest.mark.parametrize("sql", [
    "EXPLAIN PIPELINE INSERT INTO FUNCTION file('/tmp/f', 'CSV') SELECT 1",  # creates the file in chDB
    "EXPLAIN AST CREATE TABLE t (a Int8) ENGINE = Memory",
    "EXPLAIN SYSTEM FLUSH LOGS",
])
def test_explain_only_of_a_select(sql):
    refused(sql)


@pytest.mark.parametrize("sql", [
    "SELECT 1; SELECT 2",
    "SELECT 1; INSERT INTO FUNCTION file('/tmp/f', 'CSV') SELECT 1",
    "SELECT 1 ;; SELECT 2",
    "SELECT ';' ; DROP TABLE t",
])
def test_more_than_one_statement_is_refused(sql):
    refused(sql)


@pytest.mark.parametrize("sql", [
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT 1 SETTINGS readonly=0",
    "select 1 settings max_execution_time = 100000, readonly = 2",
    "SELECT 1 SETTINGS `readonly` = 0",
    "SELECT * FROM jitterscope.processes SETTINGS /* c */ max_result_rows = 0",
])
def test_settings_clauses_are_refused(sql):
    assert "SETTINGS" in refused(sql)


@pytest.mark.parametrize("sql", [
    # ClickHouse nests /* */ comments: '/* /* */' alone would leave the
    # second half of the comment looking like code and the quote like a string
    "SELECT 1 /* /* */ ' */ INTO OUTFILE '/tmp/f' -- '",
    # a -- comment ends at \n only, not at \r (checked in chDB)
    "SELECT 1 -- \r' \n INTO OUTFILE '/tmp/f' --'",
    # escaped and doubled quotes do not end a string
    "SELECT 'a\\' INTO OUTFILE ' INTO OUTFILE '/tmp/f'",
    "SELECT 'a'' b' INTO OUTFILE '/tmp/f'",
])
def test_comment_and_quote_tricks_do_not_hide_anything(sql):
    refused(sql)


@pytest.mark.parametrize("sql", [
    "SELECT 1 # ' \n INTO OUTFILE '/tmp/f' -- '",  # '# ' is a comment in ClickHouse
    "SELECT $$ ' $$ INTO OUTFILE '/tmp/f' -- '",  # heredoc string
    "SELECT 1 /* unterminated",
    "SELECT 'unterminated",
    "SELECT 1 \\ 2",
    "SELECT 1\u00a0+ 1",  # non-ASCII outside quotes
    "SELECT 1\0 INTO OUTFILE '/tmp/f'",
])
def test_syntax_the_guard_does_not_model_is_refused(sql):
    refused(sql)


def test_parameters_are_checked_as_bound():
    # clickhouse-connect fills %(x)s in by text, so a value inside a literal
    # closes it: this binds to SELECT 1, ''INTO OUTFILE'/tmp/f' (checked in chDB)
    assert "INTO OUTFILE" in refused("SELECT 1, '%(x)s/tmp/f'", {"x": "INTO OUTFILE"})
    refused("SELECT {x:String}", {"x": ["not", "a", "scalar"]})
    refused("SELECT 1, '%(x)s'", {"x": "it's"})  # the same break-out, caught as a stray backslash
    check("SELECT 1, %(x)s", {"x": "it's fine"})
    check("SELECT {host:String}, {n:UInt32}", {"host": "h' INTO OUTFILE '/tmp/f", "n": "3"})  # sent typed


@pytest.mark.parametrize("sql", [
    "SELECT 1",
    "select 1;",
    "SELECT 'INTO OUTFILE', 'file(', 'SETTINGS readonly=0' -- into outfile\n",
    "SELECT \"into\", `outfile` FROM jitterscope.processes /* INTO OUTFILE '/x' */",
    "SELECT file_name, url_path, remote_addr FROM t WHERE file_name LIKE '%.so'",
    "SELECT host, count() AS n FROM jitterscope.runq_events WHERE ts > now() - INTERVAL 1 HOUR "
    "GROUP BY host ORDER BY n DESC LIMIT 10",
    "WITH recent AS (SELECT * FROM jitterscope.alerts WHERE raised > now() - INTERVAL 1 DAY) "
    "SELECT kind, count() FROM recent GROUP BY kind",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SHOW TABLES FROM jitterscope",
    "SHOW CREATE TABLE jitterscope.processes",
    "DESCRIBE TABLE jitterscope.processes",
    "DESC jitterscope.processes",
    "EXISTS TABLE jitterscope.processes",
    "EXPLAIN SELECT 1",
    "EXPLAIN PLAN header = 1, actions = 1 SELECT 1",
    "EXPLAIN QUERY TREE (SELECT 1)",
    "SELECT * FROM numbers(10) WHERE number % 2 = 0",
    "SELECT Settings FROM system.query_log LIMIT 1",  # a column named like the clause
    "SELECT 'a\\'b', 'c''d', 1 AS a$b",
    "SELECT count() FROM system.tables",
    "SELECT * FROM jitterscope.processes FINAL WHERE host = {host:String} AND comm = 'x' FORMAT Native",
    "SELECT 'ünïcode ✓' AS s",
])
def test_ordinary_reads_pass(sql):
    check(sql)


def test_refusals_are_jitterscope_errors_with_one_line():
    assert issubclass(UnsafeQuery, JitterscopeError)
    assert "\n" not in refused("SELECT 1;\nSELECT 2")


def test_system_tables_with_credentials_are_refused():
    refused("SELECT * FROM system.named_collections")
    refused("SELECT * FROM `system`.`named_collections`")


def test_every_table_function_of_this_chdb_is_classified(tmp_path):
    """A chDB upgrade that adds a table function fails here until someone
    decides whether it is safe."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "ch"))
    try:
        names = {row[0] for row in client.query("SELECT name FROM system.table_functions").result_rows}
    finally:
        client.close()
    unclassified = {n for n in names if n.lower() not in readonly_sql.DENIED_FUNCTIONS
                    and n not in readonly_sql.SAFE_TABLE_FUNCTIONS}
    assert not unclassified, f"classify these table functions in streams/readonly_sql.py: {sorted(unclassified)}"
    assert not {n.lower() for n in readonly_sql.SAFE_TABLE_FUNCTIONS} & readonly_sql.DENIED_FUNCTIONS


# --- round two: ClickHouse's own reading of the text ------------------------

#: the two shapes the security review used: // is a comment to ClickHouse, so
#: a quote inside it hid the next line from a guard that did not know that
SLASH_COMMENT_ATTACKS = [
    "SELECT 1 // '\n, file('/etc/hostname') AS leaked -- '",
    "SELECT 1 // '\n; SELECT 'x' INTO OUTFILE '/tmp/jitterscope-guard-victim' TRUNCATE FORMAT RawBLOB; "
    "SELECT 2 -- '",
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A throwaway chDB, read-only as the query paths open theirs."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(interface="chdb", path=str(tmp_path_factory.mktemp("ch")),
                                           settings={"readonly": 1})
    yield client
    client.close()


def engine_refused(client, sql: str, parameters: dict | None = None) -> str:
    with pytest.raises(UnsafeQuery) as info:
        readonly_sql.check_with_engine(client, sql, parameters)
    message = str(info.value)
    assert "\n" not in message and message.startswith("refused: ")
    return message


@pytest.mark.parametrize("sql", SLASH_COMMENT_ATTACKS)
def test_slash_comments_are_refused_by_the_tokens(sql):
    assert "// comments" in refused(sql)


@pytest.mark.parametrize("sql", SLASH_COMMENT_ATTACKS)
def test_slash_comment_attacks_run_nothing(engine, sql):
    victim = Path("/tmp/jitterscope-guard-victim")
    victim.unlink(missing_ok=True)
    with pytest.raises(UnsafeQuery):
        readonly_sql.run(engine, sql)
    with pytest.raises(UnsafeQuery):
        readonly_sql.run_raw(engine, sql)
    assert not victim.exists()


def test_the_engine_reading_catches_what_the_tokens_would_miss(engine, monkeypatch):
    """With our own reading blinded to //, ClickHouse's still sees file()
    and the second statement: the two readings do not share a lexer."""
    monkeypatch.setattr(readonly_sql, "check", lambda sql, parameters=None: None)
    assert "file()" in engine_refused(engine, SLASH_COMMENT_ATTACKS[0])
    assert "one statement" in engine_refused(engine, SLASH_COMMENT_ATTACKS[1])
    assert "INSERT" in engine_refused(engine, "WITH 1 AS x INSERT INTO t SELECT x")
    assert "SETTINGS" in engine_refused(engine, "SELECT 1 # '\n SETTINGS readonly = 0 -- '")


def test_with_before_insert_is_refused(engine):
    engine_refused(engine, "WITH 1 AS x INSERT INTO t SELECT x")
    engine_refused(engine, "WITH (SELECT 1) AS x INSERT INTO FUNCTION null('a UInt8') SELECT x")


@pytest.mark.parametrize("sql", [
    "SELECT * FROM merge('system', '^named_collections$')",
    "SELECT * FROM merge('SYSTEM', 'named')",
    "SELECT * FROM merge('information_schema', '.*')",
    "SELECT * FROM merge(REGEXP('^sys'), '^named')",
    "SELECT * FROM merge(currentDatabase(), '^named')",
    "SELECT * FROM merge({db:String}, '^named')",
    "SELECT * FROM merge('^named_collections$')",
])
def test_merge_over_the_system_database_is_refused(sql):
    assert "merge()" in refused(sql)


@pytest.mark.parametrize("name", ["aiGenerate", "aiEmbed", "AIClassify", "aiRedact"])
def test_ai_functions_are_refused(name):
    assert f"{name}()" in refused(f"SELECT {name}('summarize ' || (SELECT groupArray(cmdline) FROM t))")


def test_every_function_of_a_denied_category_is_denied(engine):
    """A chDB upgrade that adds an AI function fails here until it is denied."""
    names = {row[0] for row in engine.query(
        "SELECT name FROM system.functions WHERE categories IN {c:Array(String)}",
        parameters={"c": sorted(readonly_sql.DENIED_FUNCTION_CATEGORIES)}).result_rows}
    assert names, "no function in the denied categories: has chDB renamed them?"
    assert {n.lower() for n in names} <= readonly_sql.DENIED_FUNCTIONS


@pytest.mark.parametrize("sql", [
    "SELECT * FROM merge('jitterscope', '^runq')",
    "SELECT 'a // b', 1 AS `x//y` -- // \n",
    "SELECT 4 / 2",
])
def test_reads_with_lookalikes_pass(sql, engine):
    check(sql)
    readonly_sql.check_with_engine(engine, sql)


def test_ordinary_reads_pass_the_engine_reading_too(engine):
    for case in test_ordinary_reads_pass.pytestmark[0].args[1]:
        readonly_sql.check_with_engine(engine, case)
    assert readonly_sql.run(engine, "SELECT 41 + {n:UInt8} AS n", {"n": 1}) == (["n"], [[42]])


def test_a_typo_is_one_line_naming_the_syntax_error(engine):
    assert "Syntax error" in engine_refused(engine, "SELECT 1 FORM system.one")


# -- {name:Identifier} parameters (issue 40, item 11) ---------------------------

IDENTIFIER_ATTACKS = [
    ("SELECT * FROM {t:Identifier}", {"t": "system.named_collections"}),
    ("SELECT * FROM {d:Identifier}.{t:Identifier}", {"d": "system", "t": "named_collections"}),
    ("SELECT * FROM system.{t:Identifier}", {"t": "named_collections"}),
    ("SELECT * FROM { d : Identifier }.named_collections", {"d": "SYSTEM"}),
    ("SELECT * FROM jitterscope.alerts SETTINGS {s:Identifier} = 0", {"s": "readonly"}),
]


@pytest.mark.parametrize("sql, parameters", IDENTIFIER_ATTACKS)
def test_identifier_parameters_are_checked_in_place(engine, sql, parameters):
    with pytest.raises(UnsafeQuery, match="parameters in place"):
        check(sql, parameters)
    engine_refused(engine, sql, parameters)


def test_the_engine_reading_fills_in_identifiers_our_tokens_miss(engine):
    """A comment inside the marker hides it from our reading; ClickHouse's
    canonical text has it plain, and the value is put in there."""
    message = engine_refused(engine, "SELECT * FROM {d /* */ :Identifier}.named_collections", {"d": "system"})
    assert "named_collections holds credentials" in message and "system.named_collections" in message


@pytest.mark.parametrize("value", ["system named_collections", "a.b.c", "`system`", "x; DROP", "", 5, "t\n"])
def test_identifier_values_must_be_plain_names(value):
    with pytest.raises(UnsafeQuery, match="not a plain name.*jitterscope.alerts"):
        check("SELECT * FROM {t:Identifier}", {"t": value})


def test_identifier_without_a_value_is_refused_with_the_fix():
    with pytest.raises(UnsafeQuery, match="--param t=jitterscope.alerts"):
        check("SELECT * FROM {t:Identifier}", {"u": "x"})


def test_identifier_parameters_naming_ordinary_tables_run(engine):
    assert readonly_sql.run(engine, "SELECT count() AS n FROM {d:Identifier}.{t:Identifier}",
                            {"d": "system", "t": "one"}) == (["n"], [[1]])
    assert readonly_sql.run(engine, "SELECT {c:Identifier} FROM system.one", {"c": "dummy"}) == (["dummy"], [[0]])
    check("SELECT * FROM {t:Identifier}", {"t": "jitterscope.alerts"})
