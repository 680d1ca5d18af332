"""``[NOT] EXISTS`` that compares its rows with the query's row (TPC-H q21's shape):
allowed when one equality ties both rows to one person (on the unit, or along a
declared link), answered at the exact truth where the caps keep every row, priced
as a nested loop over one person's rows, and refused, in one line, when no equality
ties the rows to one person."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError, Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.request import QueryRequest
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.resolve import resolve
from tests import shop

EPSILON = 1e4  # noise of a few hundredths at the caps below: answers are the truth
# Caps no customer of the shop reaches (6 orders of 4 lines at most), so the bounded
# data is the data and an answer is the exact truth, to the noise.
ROOMY = ("max_rows_per_partition = 8", "max_rows_per_partition = 24")

# TPC-H q21 on the shop: lines of urgent orders by flag, in an order with a line of
# another part, and with no line of another part that holds more than 25.
Q21 = (
    "SELECT l1.l_flag, COUNT(*) AS numwait FROM lineitem l1, orders "
    "WHERE o_orderkey = l1.l_orderkey "
    "AND o_priority = '1-URGENT' AND l1.l_quantity > 10 "
    "AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey "
    "AND l2.l_partkey <> l1.l_partkey) "
    "AND NOT EXISTS (SELECT * FROM lineitem l3 WHERE l3.l_orderkey = l1.l_orderkey "
    "AND l3.l_partkey <> l1.l_partkey AND l3.l_quantity > 25) "
    "GROUP BY l1.l_flag ORDER BY l1.l_flag"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shop")
    shop.build(out / "shop.duckdb")
    text = shop.policy_text(out / "shop.duckdb", out / "state").replace(*ROOMY)
    (out / "shop.toml").write_text(text)
    return out


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Engine]:
    e = Engine(load_policy(folder / "shop.toml"))
    yield e
    e.close()


def _ask(engine: Engine, sql: str) -> list:
    return engine.query("ann", {"sql": sql, "epsilon": EPSILON, "fresh": True})["rows"]


def _truth(folder: Path, sql: str) -> list:
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _plan(engine: Engine, sql: str) -> Plan:
    dataset = engine.policy.dataset("shop")
    return engine.analyse(dataset, QueryRequest.from_body({"sql": sql, "epsilon": 1.0}))


def _near(got: list, truth: list) -> None:
    assert [r[:-1] for r in got] == [list(r[:-1]) for r in truth]
    for g, t in zip(got, truth, strict=True):
        assert abs(g[-1] - t[-1]) <= 1, (g, t)


def test_q21_shape_is_answered_at_the_truth(engine, folder):
    truth = _truth(folder, Q21)
    assert sum(r[-1] for r in truth) > 20  # the conditions keep and drop rows alike
    _near(_ask(engine, Q21), truth)


@pytest.mark.parametrize(
    "sql",
    [
        # Tied on the unit itself, the comparison on two other columns.
        "SELECT c_segment, COUNT(*) FROM customer c WHERE EXISTS (SELECT 1 FROM orders o "
        "WHERE o.o_custkey = c.c_custkey AND o.o_total > c.c_acctbal) "
        "GROUP BY c_segment ORDER BY c_segment",
        # The tie is the second equality; the first compares two parts.
        "SELECT l1.l_flag, COUNT(*) FROM lineitem l1 WHERE EXISTS (SELECT 1 FROM lineitem l2 "
        "WHERE l2.l_partkey = l1.l_partkey AND l2.l_orderkey = l1.l_orderkey "
        "AND l2.l_quantity <> l1.l_quantity) GROUP BY l1.l_flag ORDER BY l1.l_flag",
        # NOT EXISTS, an expression of the line compared with the query's order.
        "SELECT o_priority, COUNT(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM lineitem l "
        "WHERE l.l_orderkey = o.o_orderkey AND l.l_price * l.l_quantity > o.o_total) "
        "GROUP BY o_priority ORDER BY o_priority",
    ],
)
def test_comparisons_tied_to_one_person_are_answered_at_the_truth(engine, folder, sql):
    _near(_ask(engine, sql), _truth(folder, sql))


@pytest.mark.parametrize(
    "sql",
    [
        # Tied on a column many persons share: a row would read other persons' rows.
        "SELECT COUNT(*) FROM lineitem l1 WHERE EXISTS (SELECT 1 FROM lineitem l2 "
        "WHERE l2.l_partkey = l1.l_partkey AND l2.l_orderkey <> l1.l_orderkey)",
        # No equality at all.
        "SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM orders x "
        "WHERE x.o_total > o.o_total)",
    ],
)
def test_comparisons_not_tied_to_one_person_are_refused_in_one_line(engine, sql):
    with pytest.raises(GateError) as info:
        _ask(engine, sql)
    message = info.value.message
    assert "must tie them to one person" in message
    assert "\n" not in message and len(message) < 300


def test_a_subquery_inside_a_comparison_is_refused(engine):
    sql = (
        "SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM lineitem l WHERE "
        "l.l_orderkey = o.o_orderkey AND (l.l_flag <> 'A' OR o.o_orderkey IN "
        "(SELECT x.l_orderkey FROM lineitem x WHERE x.l_quantity > 3)))"
    )
    with pytest.raises(GateError, match="may not hold a subquery") as info:
        _ask(engine, sql)
    assert "\n" not in info.value.message and len(info.value.message) < 300
    # A subquery in a condition on the subquery's own rows is refused for its own
    # reason, not as a comparison with the query's row.
    own = (
        "SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM lineitem l WHERE "
        "l.l_orderkey = o.o_orderkey AND l.l_flag IN (SELECT x.l_flag FROM lineitem x))"
    )
    with pytest.raises(GateError, match="must match privacy units"):
        _ask(engine, own)


def test_a_link_tie_brings_the_units_equality(engine):
    """The structural defence: tied along ``l_orderkey``, the comparisons carry the
    equality of the two rows' units, so whatever the key holds, a row is compared with
    its own person's rows only."""
    dataset = engine.policy.dataset("shop")
    resolved = resolve(parse(Q21), dataset)
    unit = dataset.tables["lineitem"].unit
    assert len(resolved.semijoins) == 2
    for j in resolved.semijoins:
        assert j.correlated is not None
        units = [
            e for e in j.correlated.find_all(exp.EQ)
            if {c.name for c in e.find_all(exp.Column)} == {unit}
        ]  # fmt: skip
        assert len(units) == 1, j.correlated.sql()


def test_the_work_counts_one_persons_pairs(engine):
    """Each compared EXISTS is priced as a nested loop over one person's rows: its
    rows around it times its rows inside; a limit below the total refuses, free."""
    plan = _plan(engine, Q21)
    main, first, second, *pairs = plan.work.joins  # the query's, each subquery's, pairs
    assert [p.rows for p in pairs] == [main.rows * first.rows, main.rows * second.rows]
    dataset = engine.policy.dataset("shop")
    small = replace(dataset, max_unit_work=plan.work.total - 1)
    with pytest.raises(Refused, match="max_unit_work"):
        engine.analyse(small, QueryRequest.from_body({"sql": Q21, "epsilon": 1.0}))
    plain = Q21.replace(" AND l3.l_partkey <> l1.l_partkey", "").replace(
        " AND l2.l_partkey <> l1.l_partkey", ""
    )
    assert len(_plan(engine, plain).work.joins) == 3  # tied alone: no pairs to price
