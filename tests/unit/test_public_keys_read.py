"""A key that is a public table's column whose values the gate read from the table at
start (``Column.values_read``): every row's key is one of them, so the SQL filters it
by NOT NULL alone, not by a list of every value (TPC-H's query 21 at scale factor 1
grouped by 10,000 suppliers' names, 200,000 characters past the gate's limit on the
SQL it generates). A column whose values the owner declared keeps its list: its rows
may hold others."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy
from dpmagic.gate.request import QueryRequest, tightened
from tests import shop

BY_BRAND = (
    "SELECT p_brand, COUNT(*) AS n FROM lineitem JOIN part ON l_partkey = p_partkey "
    "GROUP BY p_brand"
)


def _engine(tmp: Path, declared: bool) -> Engine:
    shop.build(tmp / "shop.duckdb", customers=20)
    text = shop.policy_text(tmp / "shop.duckdb", tmp / "state")
    text += 'columns.p_partkey = { type = "int" }\n'
    if declared:
        text += 'columns.p_brand = { type = "str", public_values = ["Brand#1", "Brand#2"] }\n'
    else:
        text += 'columns.p_brand = { type = "str" }\n'
    (tmp / "shop.toml").write_text(text)
    return Engine(load_policy(tmp / "shop.toml"))


def _sql(engine: Engine, sql: str) -> str:
    request = QueryRequest.from_body({"sql": sql, "dataset": "shop", "epsilon": 1.0})
    dataset = tightened(engine._dataset("shop"), request)
    return engine.analysis("ann", dataset, request).analysed.rewritten.sql


def test_a_key_read_from_its_public_table_is_filtered_by_not_null(tmp_path):
    engine = _engine(tmp_path, declared=False)
    try:
        sql = _sql(engine, BY_BRAND)
        assert "Brand#" not in sql and "IS NULL" in sql
        reply = engine.query("ann", {"sql": BY_BRAND, "dataset": "shop", "epsilon": 1.0})
        assert sorted(row[0] for row in reply["rows"]) == [f"Brand#{i}" for i in range(5)]
    finally:
        engine.close()


def test_a_key_the_owner_declared_keeps_its_list(tmp_path):
    """The owner's two brands of five: the SQL keeps only their rows, and only they are
    released."""
    engine = _engine(tmp_path, declared=True)
    try:
        assert "'Brand#1', 'Brand#2'" in _sql(engine, BY_BRAND)
        reply = engine.query("ann", {"sql": BY_BRAND, "dataset": "shop", "epsilon": 1.0})
        assert sorted(row[0] for row in reply["rows"]) == ["Brand#1", "Brand#2"]
    finally:
        engine.close()


@pytest.mark.parametrize("declared", [False, True])
def test_the_columns_own_facts_say_where_its_values_came_from(tmp_path, declared):
    engine = _engine(tmp_path, declared)
    try:
        column = engine._dataset("shop").tables["part"].columns["p_brand"]
        assert column.values_read is not declared
    finally:
        engine.close()
