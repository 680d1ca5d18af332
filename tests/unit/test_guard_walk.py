"""The guard's walk reads every object of DuckDB's serialised parse tree: gathered as
``json.loads`` builds them (``database._gathered``), they are exactly the objects a
walk of the finished tree finds, however deep (in lists, in subqueries, in CTEs); a
hook that kept only the top-level objects would miss the nested table functions the
guard must see. And the vet runs the statement the walk had DuckDB parse rather than
the text: each of a set of failing and passing texts ends alike either way."""

from __future__ import annotations

import json

import duckdb
import pytest

from dpmagic.gate.engines.duckdb.database import _gathered

TEXTS = [
    "SELECT 1",
    "SELECT a, SUM(b) FROM t WHERE c IN (SELECT c FROM u) GROUP BY a",
    "WITH x AS (SELECT * FROM t), y AS (SELECT * FROM x) SELECT COUNT(*) FROM y JOIN t USING (a)",
    "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM read_csv('f.csv') AS r WHERE r.a = t.a)",
    "SELECT LIST_VALUE(1, 2, (SELECT MAX(a) FROM range(3) AS g(a))) AS l",
    "SELECT $p + 1 AS v, CASE WHEN a > 1 THEN 'x' ELSE 'y' END FROM t",
]


def _walked(tree: object) -> list[dict]:
    """Every JSON object in the tree, by a walk of the finished tree."""
    out, stack = [], [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            out.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return out


def _serialised(sql: str) -> str:
    con = duckdb.connect()
    try:
        return con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("sql", TEXTS)
def test_the_gathered_objects_are_every_object_of_the_tree(sql):
    text = _serialised(sql)
    gathered: list[dict] = []
    tree = json.loads(text, object_hook=_gathered(gathered))
    assert not tree.get("error")
    assert sorted(map(id, gathered)) == sorted(map(id, _walked(tree)))


def test_a_walk_of_the_top_level_alone_is_caught():
    text = _serialised(TEXTS[3])
    top = [o for o in json.loads(text)["statements"] if isinstance(o, dict)]
    functions = [o for o in _walked(json.loads(text)) if o.get("type") == "TABLE_FUNCTION"]
    assert functions and not any(o.get("type") == "TABLE_FUNCTION" for o in top)


# The vet runs the statement the walk had DuckDB parse, not the text: the same
# outcome, an error or rows, for SQL that binds, folds, overflows or names parameters.
RUNS = [
    ("SELECT COUNT(*), SUM(a) FROM t WHERE rowid < $p", {"p": 0}),
    ("SELECT CAST('x' AS INTEGER)", None),
    ("SELECT b FROM t", None),
    ("SELECT 9223372036854775807::BIGINT * 2", None),
    ("SELECT 9223372036854775807::BIGINT * 2 + a FROM t", None),
    ("SELECT $q + 1", {"p": 0}),
    ("SELECT 1 // 0", None),
    ("SELECT 'abc'::DATE", None),
]


def _outcome(con: duckdb.DuckDBPyConnection, query: object, params: dict | None) -> tuple:
    try:
        return ("rows", con.execute(query, params).fetchall())
    except duckdb.Error as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize(("sql", "params"), RUNS)
def test_a_parsed_statement_runs_as_its_text(sql, params):
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE t (a INTEGER, s VARCHAR)")
        (statement,) = con.extract_statements(sql)
        assert _outcome(con, statement, params) == _outcome(con, sql, params)
    finally:
        con.close()
