"""Escape hatches, closed twice.

Each statement below would read data, files, the catalog or settings, keep
state between queries, or return row values if DuckDB ran it as written. The
analysis pipeline refuses each one before the data is touched, charging
nothing; and each also fails on the locked connection itself (the read-only,
no-external-access, locked-configuration database and its execution guard),
so that a gap in the allow-list would still not open it.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.engines.duckdb.database import UnsafeSQL
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import running_engine

POLICY = """
[gate]
state_dir = "state"
query_timeout_s = 2

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 5.0 }
notebook_budget = { epsilon = 5.0 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
x = { type = "int", lower = 0, upper = 10 }
s = { type = "str" }
"""

HATCHES = {
    # file readers and files named in FROM
    "read_csv": "SELECT COUNT(*) FROM read_csv('/etc/passwd')",
    "read_text": "SELECT COUNT(*) FROM read_text('/etc/hostname')",
    "read_blob": "SELECT COUNT(*) FROM read_blob('/etc/hostname')",
    "read_json": "SELECT COUNT(*) FROM read_json_auto('/etc/hostname')",
    "read_parquet": "SELECT COUNT(*) FROM read_parquet('data.parquet')",
    "glob": "SELECT COUNT(*) FROM glob('/etc/*')",
    "sniff_csv": "SELECT COUNT(*) FROM sniff_csv('/etc/passwd')",
    "from path": "SELECT COUNT(*) FROM '/etc/passwd'",
    "from policy": "SELECT COUNT(*) FROM 'policy.toml'",
    # other databases, copies, extensions
    "attach": "ATTACH 'other.duckdb' AS o",
    "attach memory": "ATTACH ':memory:' AS m",
    "detach": "DETACH d",
    "copy to": "COPY t TO 'out.csv'",
    "copy query": "COPY (SELECT * FROM t) TO 'out.csv'",
    "export": "EXPORT DATABASE 'dump'",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "load builtin": "LOAD json",
    # settings and variables
    "pragma": "PRAGMA table_info('t')",
    "pragma set": "PRAGMA threads = 1",
    "set": "SET threads = 1",
    "set access": "SET enable_external_access = true",
    "reset": "RESET threads",
    "set variable": "SET VARIABLE v = 42",
    "getvariable": "SELECT COUNT(*) FROM t WHERE x = getvariable('v')",
    "current_setting": "SELECT COUNT(*) FROM t WHERE current_setting('threads') = 2",
    # catalog and metadata
    "duckdb_tables": "SELECT COUNT(*) FROM duckdb_tables()",
    "duckdb_settings": "SELECT COUNT(*) FROM duckdb_settings()",
    "duckdb_columns in where": (
        "SELECT COUNT(*) FROM t WHERE x IN (SELECT column_index FROM duckdb_columns())"
    ),
    "pragma_table_info": "SELECT COUNT(*) FROM pragma_table_info('t')",
    "information_schema": "SELECT COUNT(*) FROM information_schema.tables",
    "system catalog": "SELECT COUNT(*) FROM system.main.duckdb_tables",
    "summarize": "SUMMARIZE t",
    "describe": "DESCRIBE t",
    "show": "SHOW TABLES",
    "explain analyze": "EXPLAIN ANALYZE SELECT COUNT(*) FROM t",
    "call": "CALL pragma_version()",
    # SQL that runs SQL
    "query()": "SELECT COUNT(*) FROM query('SELECT * FROM t')",
    "query_table()": "SELECT COUNT(*) FROM query_table('t')",
    # more than one statement, and state that would outlive a query
    "two statements": "SELECT COUNT(*) FROM t; SELECT COUNT(*) FROM t",
    "temp table": "CREATE TEMP TABLE keep AS SELECT * FROM t",
    "temp view": "CREATE TEMP VIEW keep AS SELECT * FROM t",
    "temp macro": "CREATE TEMP MACRO leak(a) AS a + 1",
    "sequence": "CREATE TEMP SEQUENCE seq",
    "insert": "INSERT INTO t VALUES (1, 1, 'a')",
    "recursive cte": (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    ),
    # sampling: DuckDB's own randomness, and a sample's count is not a count of units
    "using sample": "SELECT COUNT(*) FROM t USING SAMPLE 50%",
    "tablesample": "SELECT COUNT(*) FROM t TABLESAMPLE 50%",
    # aggregates that return row values
    "list": "SELECT list(s) FROM t",
    "array_agg": "SELECT array_agg(x) FROM t",
    "string_agg": "SELECT string_agg(s, ',') FROM t",
    "group_concat": "SELECT group_concat(s) FROM t",
    "json_group_array": "SELECT json_group_array(s) FROM t",
    "first": "SELECT first(s) FROM t",
    "any_value": "SELECT any_value(s) FROM t",
    "arg_max": "SELECT arg_max(s, x) FROM t",
    "max_by": "SELECT max_by(s, x) FROM t",
    "mode": "SELECT mode(s) FROM t",
}


# Refused in the user's SQL; the gate's own SQL counts quantile candidates with it.
PIPELINE_ONLY = {"histogram": "SELECT histogram(x) FROM t"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    rows = [(i, i % 11, f"name{i}") for i in range(50)]
    with running_engine(tmp_path_factory.mktemp("escape"), POLICY, {"t": ("pid,x,s", rows)}) as e:
        yield e


@pytest.mark.parametrize(
    "sql", [*HATCHES.values(), *PIPELINE_ONLY.values()], ids=[*HATCHES, *PIPELINE_ONLY]
)
def test_the_pipeline_refuses_it_and_charges_nothing(engine, sql):
    with pytest.raises(Refused) as refused:
        engine.query("mallory", {"sql": sql})
    message = refused.value.message
    assert "\n" not in message and "name1" not in message
    assert engine.ledger.spent("mallory", "d").epsilon == 0.0


@pytest.mark.parametrize("sql", list(HATCHES.values()), ids=list(HATCHES))
def test_the_locked_connection_refuses_it_too(engine, sql):
    with pytest.raises((duckdb.Error, UnsafeSQL, OutOfResources)):
        engine.databases["d"].run(sql)


def test_temp_objects_made_on_the_database_do_not_reach_the_next_query(engine):
    db = engine.databases["d"]
    con = db._db.cursor()  # as if the guard had been passed once
    con.execute("CREATE TEMP TABLE keep AS SELECT 1 AS a")
    con.close()
    fresh = db._db.cursor()
    try:
        with pytest.raises(duckdb.CatalogException):
            fresh.execute("SELECT a FROM keep")
    finally:
        fresh.close()


ACCEPTED = [
    "SELECT COUNT(*) FROM t",
    "SELECT SUM(x), AVG(x) FROM t WHERE s LIKE 'name1%'",
    "SELECT COUNT(*) FROM t WHERE TRY_CAST(s AS INT) IS NULL",
    "SELECT SUM(x / (x - 5)) FROM t",
    # A trimmed sum ranks the values by a window: the guard refuses a list of them.
    "SELECT TRIMMED_MEAN(x, 0.2) FROM t",
]


@pytest.mark.parametrize("sql", ACCEPTED)
def test_what_the_rewrite_generates_passes_the_guard_with_count_and_sum_only(engine, sql):
    """The second barrier for value-returning aggregates: whatever the user wrote, the SQL
    DuckDB sees aggregates with COUNT and SUM alone, and the guard lets it through."""
    ds = engine.policy.dataset("d")
    generated = rewrite(engine.analyse(ds, _request(sql))).sql
    engine.databases["d"].run(generated)
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(generated, dialect="duckdb")
    aggregates = {type(n).__name__ for n in tree.find_all(exp.AggFunc)}
    assert aggregates <= {"Count", "Sum", "RowNumber", "DenseRank"}, aggregates
    assert "name1" not in generated or "LIKE" in generated  # only the user's literal pattern


def _request(sql: str):
    from dpmagic.gate.request import QueryRequest

    return QueryRequest.from_body({"sql": sql})
