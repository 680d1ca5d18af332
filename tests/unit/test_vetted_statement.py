"""A DuckDB store runs on the data the very statement its guard parsed (``Vetted``):
DuckDB parses a generated text for the guard (its statement, and the JSON it walks),
and the empty copy's run and the data's run both execute that statement, as a plain
read of public tables does; a text the guard has not seen (its verdict evicted) is
walked again before it runs. Caught: a run that executes the text, which DuckDB would
parse a third time."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.engines.duckdb.database import Database, Vetted
from tests.gate_helpers import running_engine

POLICY = """
[gate]
state_dir = "{state}"

[datasets.d]
sources = {{ t = "t.csv", p = "p.csv" }}
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = 100 }}
public_tables_readable = true

[datasets.d.tables.p]
public = true
[datasets.d.tables.p.columns]
k = {{ type = "int" }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
x = {{ type = "int", lower = 0, upper = 99 }}
"""

QUERY = {"sql": "SELECT x % 3 AS k, COUNT(*) AS n FROM t GROUP BY k", "epsilon": 50}
TABLE = [(unit, unit % 100) for unit in range(300) for _ in range(1 + unit % 3)]


class _Recording:
    """A DuckDB connection whose cursors note what each ``execute`` is given."""

    def __init__(self, con: duckdb.DuckDBPyConnection, seen: list[object]) -> None:
        self._con, self._seen = con, seen

    def cursor(self) -> _Recording:
        return _Recording(self._con.cursor(), self._seen)

    def execute(self, query: object, *args: object) -> object:
        self._seen.append(query)
        return self._con.execute(query, *args)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._con, name)


def _runs(store: Database, seen: list[object]) -> list[object]:
    """What the data's runs executed: every ``execute`` but the catalog's ``USE``."""
    return [q for q in seen if not (isinstance(q, str) and q.startswith("USE "))]


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    tables = {"t": ("pid,x", TABLE), "p": ("k", [(k,) for k in range(5)])}
    with running_engine(tmp_path, POLICY.format(state=tmp_path / "state"), tables) as e:
        yield e


def _recorded(engine: object) -> tuple[Database, list[object], list[str]]:
    store: Database = engine.databases["d"]  # type: ignore[attr-defined]
    seen: list[object] = []
    store._db = _Recording(store._db, seen)  # type: ignore[assignment]
    sqls: list[str] = []
    run = store.run

    def noted(sql: str, *args: object, **named: object) -> object:
        sqls.append(sql)
        return run(sql, *args, **named)  # type: ignore[arg-type]

    store.run = noted  # type: ignore[method-assign,assignment]
    return store, seen, sqls


def _ran(engine: object) -> tuple[object, object]:
    """What one fresh query's run on the data executed, and the statement the guard
    walked for its text."""
    store, seen, sqls = _recorded(engine)
    exact = engine.query("alice", {**QUERY, "fresh": True})  # type: ignore[attr-defined]
    assert exact["rows"]
    (sql,) = sqls
    (ran,) = _runs(store, seen)
    return ran, store._vetted[sql].statement


def test_the_data_runs_the_statement_the_guard_walked(engine: object) -> None:
    ran, walked = _ran(engine)
    assert isinstance(ran, duckdb.Statement)
    assert ran is walked


def test_a_text_whose_verdict_was_evicted_is_walked_before_it_runs(engine: object) -> None:
    store, seen, sqls = _recorded(engine)
    engine.query("alice", {**QUERY, "fresh": True})  # type: ignore[attr-defined]
    (sql,) = sqls
    before = store.run(sql).rows
    store._vetted.clear()
    walked: list[str] = []
    walk = store._walked

    def walking(con: duckdb.DuckDBPyConnection, text: str, *args: object) -> Vetted:
        walked.append(text)
        return walk(con, text, *args)  # type: ignore[arg-type]

    store._walked = walking  # type: ignore[method-assign,assignment]
    assert store.run(sql).rows == before
    assert walked == [sql]
    assert _runs(store, seen)[-1] is store._vetted[sql].statement


def test_a_run_of_the_text_is_caught(engine: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken version: the run executes the text, which DuckDB parses again."""
    guard = Database._guard

    def text(self: Database, con: duckdb.DuckDBPyConnection, sql: str) -> Vetted:
        return Vetted(sql, guard(self, con, sql).names)  # type: ignore[arg-type]

    monkeypatch.setattr(Database, "_guard", text)
    ran, walked = _ran(engine)
    assert not (isinstance(ran, duckdb.Statement) and ran is walked)


def test_a_public_read_runs_the_statement_the_guard_walked(engine: object) -> None:
    store, seen, _ = _recorded(engine)
    walked: list[Vetted] = []
    walk = store._walked

    def walking(con: duckdb.DuckDBPyConnection, text: str, *args: object) -> Vetted:
        walked.append(walk(con, text, *args))  # type: ignore[arg-type]
        return walked[-1]

    store._walked = walking  # type: ignore[method-assign,assignment]
    reply = engine.query("alice", {"sql": "SELECT COUNT(*) AS n FROM p"})  # type: ignore[attr-defined]
    assert reply["rows"] == [[5]]
    (vetted,) = walked
    assert _runs(store, seen)[-1] is vetted.statement
