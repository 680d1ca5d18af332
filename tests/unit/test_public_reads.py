"""Public tables read plainly where the owner allows it (``public_reads.py``): a query
over public tables only is answered exactly, free and in no ledger, at most the
policy's rows; one that reaches a private table anywhere goes the usual way; and
where the owner has not allowed it, the refusal names the key. A search over the
accepted grammar's queries (each reads a private table) finds none answered plainly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError
from dpmagic.gate.policy import load_policy
from tests import shop

PART = """
[datasets.shop.tables.part]
public = true
columns.p_partkey = { type = "int" }
columns.p_brand = { type = "str" }
"""


def _engine(folder: Path, readable: bool, limit: int = 8) -> Engine:
    text = shop.policy_text(folder / "shop.duckdb", folder / f"state{readable}")
    text = text.replace("\n[datasets.shop.tables.part]\npublic = true\n", PART)
    if readable:
        text = text.replace(
            "max_rows_per_partition = 8",
            "max_rows_per_partition = 8\npublic_tables_readable = true\n"
            f"public_row_limit = {limit}",
        )
    (folder / f"p{readable}.toml").write_text(text)
    return Engine(load_policy(folder / f"p{readable}.toml"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shop")
    shop.build(out / "shop.duckdb")
    return out


@pytest.fixture(scope="module")
def readable(folder: Path) -> Iterator[Engine]:
    e = _engine(folder, True)
    yield e
    e.close()


def _truth(folder: Path, sql: str) -> list[list]:
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    return [list(r) for r in con.execute(sql).fetchall()]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT p_brand, COUNT(*) AS n FROM part GROUP BY p_brand ORDER BY p_brand",
        "WITH b AS (SELECT * FROM part WHERE p_partkey < 4) SELECT p_partkey FROM b "
        "ORDER BY p_partkey",
        "SELECT a.p_partkey FROM part a JOIN part b ON a.p_partkey = b.p_partkey + 1 "
        "WHERE b.p_brand = 'Brand#1' ORDER BY 1",
    ],
)
def test_a_query_over_public_tables_is_answered_exactly_and_free(readable, folder, sql):
    reply = readable.query("ann", {"sql": sql, "notebook": "nb"})
    assert reply["rows"] == _truth(folder, sql)
    assert reply["cost"] == {"epsilon": 0.0, "delta": 0.0}
    assert reply["exact"] == {"public_tables": True, "row_limit": 8, "truncated": False}
    assert readable.ledger.spent("ann", "shop", "nb").epsilon == 0.0
    assert readable.history("ann", "shop", "nb", 10)["entries"] == []


def test_at_most_the_row_limit_is_returned_and_the_reply_says_so(readable):
    reply = readable.query("ann", {"sql": "SELECT p_partkey FROM part ORDER BY 1"})
    assert [r[0] for r in reply["rows"]] == list(range(1, 9))
    assert reply["exact"]["truncated"] is True


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM part JOIN lineitem ON l_partkey = p_partkey",
        "SELECT COUNT(*) FROM part WHERE p_partkey IN (SELECT l_partkey FROM lineitem)",
        "SELECT COUNT(*) FROM part WHERE EXISTS (SELECT 1 FROM lineitem "
        "WHERE l_partkey = p_partkey)",
        "WITH part AS (SELECT * FROM customer) SELECT COUNT(*) FROM part",
    ],
)
def test_a_query_that_reaches_a_private_table_is_never_read_plainly(readable, sql):
    try:
        reply = readable.query("bob", {"sql": sql, "epsilon": 1.0})
    except GateError:
        return  # refused: the usual path's verdict
    assert "exact" not in reply and reply["cost"]["epsilon"] > 0


def test_a_window_or_a_table_function_is_refused_even_where_readable(readable):
    for sql in (
        "SELECT p_partkey, row_number() OVER () FROM part",
        "SELECT * FROM read_csv('/etc/passwd')",
    ):
        with pytest.raises(GateError):
            readable.query("ann", {"sql": sql})


def test_where_the_owner_has_not_allowed_it_the_refusal_names_the_key(folder):
    e = _engine(folder, False)
    try:
        with pytest.raises(GateError, match="public_tables_readable = true") as info:
            e.query("ann", {"sql": "SELECT COUNT(*) FROM part"})
        assert len(info.value.message) < 300 and "\n" not in info.value.message
    finally:
        e.close()


def test_a_broken_vet_is_caught_by_the_guard_in_duckdb(readable, monkeypatch):
    """The broken version: a vet that takes any query for a public read. DuckDB's own
    parse, walked with the public tables as the only tables, still refuses it."""
    from dpmagic.gate import public_reads
    from dpmagic.gate.failures import PublicOnly
    from dpmagic.gate.request import QueryRequest

    monkeypatch.setattr(public_reads, "_public_only", lambda tree, dataset: True)
    request = QueryRequest.from_body({"sql": "SELECT l_price FROM lineitem"})
    with pytest.raises(GateError, match="will not run"):
        readable._read_public("mallory", request, PublicOnly("public only"))


def test_what_duckdb_cannot_run_over_public_tables_is_a_refusal(readable):
    """Over public tables only, DuckDB's own error is a refusal quoting the query, not
    a crash; an unused CTE over a private table is named for what it is."""
    with pytest.raises(GateError, match="DuckDB cannot run this query"):
        readable.query("ann", {"sql": "WITH x AS (SELECT * FROM x) SELECT * FROM part, x"})
    with pytest.raises(GateError, match="names a private table where it is not read"):
        readable.query(
            "ann",
            {"sql": "WITH c AS (SELECT * FROM customer) SELECT COUNT(*) FROM part"},
        )


def test_duckdb_never_reads_a_python_variable_for_an_unknown_table(readable):
    """DuckDB's Python client would read an unknown table's name from the calling
    frame's variables; the gate's connection has that off."""
    import pandas as pd

    secret = pd.DataFrame({"v": [1]})  # noqa: F841 - the name DuckDB would find
    store = readable.databases["shop"]
    with pytest.raises(duckdb.CatalogException):
        store._db.cursor().execute("SELECT * FROM secret").fetchall()
