"""A search over the accepted grammar (``tests/sql_grammar.py``) for the plain read of
public tables: queries drawn over FROM clauses that reach a private table through a
public-looking shape (a join, an ``IN`` or ``EXISTS`` over it, an unused or shadowing
CTE, a ``UNION``, a scalar subquery inside a subquery over the public table) are never
answered exactly, on a gate that reads public tables plainly. (The shapes come from the
public-tables helper's branch; its search ported to main's version.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError
from tests import shop
from tests.sql_grammar import Schema, swarm
from tests.unit.test_public_reads import _engine

pytestmark = pytest.mark.search

COLUMNS = {"number": ("t.p_partkey",), "text": ("t.p_brand",)}
TARGETS = ("t.p_partkey = 1", "t.p_brand = 'Brand#1'")
PRIVATE_REACH = [
    "part AS t JOIN customer AS c ON t.p_partkey = c.c_custkey",
    "part AS t, customer AS c",
    "(SELECT * FROM part WHERE p_partkey IN (SELECT c_custkey FROM customer)) AS t",
    "(SELECT * FROM part AS r WHERE EXISTS "
    "(SELECT 1 FROM customer AS c WHERE c.c_custkey = r.p_partkey)) AS t",
    "(WITH w AS (SELECT * FROM customer) SELECT * FROM part) AS t",
    "(WITH part2 AS (SELECT * FROM customer) SELECT r.* FROM part AS r "
    "JOIN part2 AS q ON r.p_partkey = q.c_custkey) AS t",
    "(SELECT * FROM part UNION ALL SELECT c_custkey, c_segment FROM customer) AS t",
    "(SELECT *, (SELECT MAX(c_acctbal) FROM customer) AS m FROM part) AS t",
]
SEARCH = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder: Path = tmp_path_factory.mktemp("shop")
    shop.build(folder / "shop.duckdb")
    e = _engine(folder, True)
    yield e
    e.close()


def test_a_drawn_query_reaching_a_private_table_is_never_read_plainly(engine):
    drawn = swarm(dict.fromkeys(PRIVATE_REACH, Schema(COLUMNS, TARGETS)))

    @SEARCH
    @given(drawn, st.booleans())
    def never_exact(sql: str, dry: bool) -> None:
        try:
            reply = engine.query(
                "mallory", {"sql": sql, "dry_run": dry, "fresh": True, "epsilon": 1.0}
            )
        except GateError as err:
            assert err.kind in ("refused", "bad_request"), (sql, err.message)
            return
        assert "exact" not in reply, sql
        assert reply["cost"]["epsilon"] > 0, sql

    never_exact()
