"""The TPC-H benchmark's own files (``benchmarks/tpch.py`` runs them): the 22 queries
parse as DuckDB SQL, each one SELECT, and the example policy loads with lines reaching
the customer through their order's key."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot

from dpmagic.gate.policy import DERIVED_UNIT, load_policy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n", range(1, 23))
def test_each_query_is_one_select(n: int) -> None:
    text = (ROOT / "benchmarks" / "tpch" / f"q{n:02d}.sql").read_text()
    (tree,) = sqlglot.parse(text, dialect="duckdb")
    assert isinstance(tree, sqlglot.exp.Select)


def test_the_example_policy_declares_the_chain() -> None:
    tables = load_policy(ROOT / "examples" / "tpch.toml").dataset("tpch").tables
    assert tables["customer"].unit == "c_custkey" and tables["customer"].max_rows == 1
    assert tables["orders"].unit == "o_custkey"
    assert tables["lineitem"].unit == DERIVED_UNIT
    assert tables["lineitem"].via is not None and tables["lineitem"].via.table == "orders"
    public = {name for name, t in tables.items() if t.public}
    assert public == {"part", "supplier", "partsupp", "nation", "region"}
