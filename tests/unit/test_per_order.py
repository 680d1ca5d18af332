"""Per-person subqueries grouped by more than the person: by a key within one person
(an order: ``GROUP BY l_orderkey``) or by the person and columns the person fixes
(``GROUP BY c_custkey, c_segment``). Each row of such a subquery is one person's (its
SQL groups by the unit too); the query around it reads a table of one row a person
where the person fixes the keys, else of at most the person's row bound, and the
window holds that bound in the query around it.

Checked: answers against DuckDB on the owner's data, what the table is declared, a
refusal for a key that mixes persons, and the neighbour brute force (every customer
removed, with all their orders and lines), shown to catch a per-order table declared
one row a person and a query around one that the window does not bound.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Dataset, load_policy
from dpmagic.gate.sql import ranks, resolve
from dpmagic.gate.sql.parse import parse
from tests import shop
from tests.gate_helpers import exact_vectors, insert_rows, make_plan

EPSILON = 1e4  # little noise: answers land on the bounded truth
PER_ORDER = (
    "SELECT n, COUNT(*) AS orders FROM (SELECT l_orderkey, COUNT(*) AS n FROM lineitem "
    "GROUP BY l_orderkey) GROUP BY n"
)
PER_SEGMENT = (
    "SELECT c_segment, AVG(n) AS a FROM (SELECT c_custkey, c_segment, COUNT(*) AS n "
    "FROM orders JOIN customer ON o_custkey = c_custkey GROUP BY c_custkey, c_segment) "
    "GROUP BY c_segment"
)
BIG_ORDERS = (
    "SELECT COUNT(*) AS big FROM (SELECT o_orderkey, SUM(l_quantity) AS q FROM orders "
    "JOIN lineitem ON l_orderkey = o_orderkey GROUP BY o_orderkey) WHERE q > 60"
)
ORDERS = (
    "SELECT COUNT(*) AS n FROM (SELECT l_orderkey, COUNT(*) AS k FROM lineitem GROUP BY l_orderkey)"
)
HEAVY = 999  # a customer with twenty orders: more than the window keeps of one


def _build(folder: Path, heavy: bool = False) -> Path:
    """The shop (fewer customers beside the heavy one: its brute force runs the query
    once a customer)."""
    database = folder / "shop.duckdb"
    shop.build(database, customers=6 if heavy else 20, seed=5)
    if heavy:
        con = duckdb.connect(str(database))
        insert_rows(con, "customer", [(HEAVY, "BUILDING", 10.0)])
        insert_rows(con, "orders", [(10_000 + i, HEAVY, "2-HIGH", 10.0) for i in range(20)])
        insert_rows(con, "lineitem", [(10_000 + i, 1, "A", 30, 10.0) for i in range(20)])
        con.close()
    policy = folder / "shop.toml"
    policy.write_text(shop.policy_text(database, folder / "state"))
    return policy


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Path]]:
    folder = tmp_path_factory.mktemp("shop")
    engine = Engine(load_policy(_build(folder)))
    yield engine, folder / "shop.duckdb"
    engine.close()


def _dataset(engine: Engine) -> Dataset:
    return engine.policy.datasets["shop"]


@pytest.mark.parametrize("sql", [PER_ORDER, PER_SEGMENT, BIG_ORDERS, ORDERS])
def test_answers_land_on_the_owners_data(served, sql):
    engine, database = served
    con = duckdb.connect(str(database), read_only=True)
    truth = {tuple(r[:-1]): r[-1] for r in con.execute(sql).fetchall()}
    con.close()
    reply = engine.query("ann", {"sql": sql, "epsilon": EPSILON, "fresh": True})
    got = {tuple(r[:-1]): r[-1] for r in reply["rows"]}
    for key, value in truth.items():  # no customer here has more rows than the bounds keep
        assert got[key] == pytest.approx(value, abs=0.05), (sql, key)
    assert all(abs(v) < 0.5 for k, v in got.items() if k not in truth), sql  # empty keys


def _table(sql: str, dataset: Dataset):
    """The table the query around a per-person subquery reads."""
    resolved = resolve.resolve(parse(sql), dataset)
    (scan,) = [s for s in resolved.scans if s.per_unit is not None]
    return scan.table, scan.per_unit


def test_a_per_order_table_holds_a_row_for_each_order_of_a_person(served):
    engine, _ = served
    table, per = _table(PER_ORDER, _dataset(engine))
    assert table.max_rows == per.rows > 1
    assert table.columns["l_orderkey"].public_values is None  # an order key is private


def test_a_segment_the_person_fixes_keeps_one_row_a_person(served):
    engine, _ = served
    table, _ = _table(PER_SEGMENT, _dataset(engine))
    assert table.max_rows == 1
    assert table.columns["c_segment"].public_values == shop.SEGMENTS


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT n, COUNT(*) FROM (SELECT l_partkey, COUNT(*) AS n FROM lineitem "
        "GROUP BY l_partkey) GROUP BY n",
        "SELECT n, COUNT(*) FROM (SELECT o_priority, COUNT(*) AS n FROM orders "
        "GROUP BY o_priority) GROUP BY n",
    ],
)
def test_a_key_that_mixes_persons_is_refused(served, sql):
    engine, _ = served
    with pytest.raises(Refused, match="key within one person"):
        engine.query("ann", {"sql": sql, "epsilon": 1.0})


def _largest_move(sql: str, dataset: Dataset, database: Path, folder: Path) -> tuple[float, float]:
    """The most the exact count moves (L1 over its cells) with one customer and all
    their orders and lines removed, over every customer; and its sensitivity."""
    p = make_plan(sql, dataset)
    (m,) = p.measurements
    assert m.kind.value == "count"  # a count's exact vector is in rows

    def run(drop: int | None) -> list:
        target = folder / f"run-{drop}.duckdb"
        shutil.copy(database, target)
        con = duckdb.connect(str(target))
        try:
            if drop is not None:
                con.execute(
                    "DELETE FROM lineitem WHERE l_orderkey IN "
                    f"(SELECT o_orderkey FROM orders WHERE o_custkey = {drop})"
                )
                con.execute(f"DELETE FROM orders WHERE o_custkey = {drop}")
                con.execute(f"DELETE FROM customer WHERE c_custkey = {drop}")
            return exact_vectors(p, con, seed=5)[m.name]
        finally:
            con.close()
            target.unlink()

    con = duckdb.connect(str(database), read_only=True)
    customers = [c for (c,) in con.execute("SELECT c_custkey FROM customer").fetchall()]
    con.close()
    whole = run(None)
    most = max(sum(abs(a - b) for a, b in zip(whole, run(c), strict=True)) for c in customers)
    return most, m.sensitivity


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Dataset, Path, Path]:
    folder = tmp_path_factory.mktemp("heavy")
    engine = Engine(load_policy(_build(folder, heavy=True)))
    try:
        return _dataset(engine), folder / "shop.duckdb", folder
    finally:
        engine.close()


@pytest.mark.parametrize("sql", [PER_ORDER, ORDERS, BIG_ORDERS])
def test_each_customer_moves_the_count_within_its_sensitivity(heavy, sql):
    dataset, database, folder = heavy
    most, sensitivity = _largest_move(sql, dataset, database, folder)
    assert 0 < most <= sensitivity


def test_a_per_order_table_wrongly_declared_one_row_a_person_stays_within(heavy, monkeypatch):
    """The rule wrong (an order key called fixed by the person): the table declared one
    row a person is made one row a person, grouped by the person alone."""
    dataset, database, folder = heavy
    monkeypatch.setattr(resolve, "fixed_by_unit", lambda *_: True)  # the broken claim
    most, sensitivity = _largest_move(ORDERS, dataset, database, folder)
    assert 0 < most <= sensitivity


def test_a_table_declared_one_row_a_person_but_grouped_by_its_keys_is_caught(heavy, monkeypatch):
    """The broken version: the wrong claim, and the SQL grouping by the order key as
    for a table of several rows a person: the heavy customer's twenty orders move the
    count by more than its sensitivity."""
    from dpmagic.gate.sql import rewrite

    dataset, database, folder = heavy
    monkeypatch.setattr(resolve, "fixed_by_unit", lambda *_: True)
    per_person = rewrite._per_person
    monkeypatch.setattr(
        rewrite,
        "_per_person",
        lambda per, used, row, table: per_person(per, used, row, replace(table, max_rows=None)),
    )
    most, sensitivity = _largest_move(ORDERS, dataset, database, folder)
    assert most > sensitivity


def test_a_per_order_table_the_window_does_not_bound_is_caught(heavy, monkeypatch):
    """Without the window for a per-person table of several rows a unit, the load-time
    ranks' bound is assumed, which nothing holds in a table made in the query."""
    dataset, database, folder = heavy
    bounding = ranks.bounding

    def ranked_anyway(ds, resolved, *args):
        scans = tuple(
            s if s.per_unit is None else resolve.replace(s, per_unit=None) for s in resolved.scans
        )
        chosen = bounding(ds, resolve.replace(resolved, scans=scans), *args)
        return chosen

    monkeypatch.setattr("dpmagic.gate.sql.plan.bounding", ranked_anyway)
    most, sensitivity = _largest_move(ORDERS, dataset, database, folder)
    assert most > sensitivity


# TPC-H query 3's shape: one group an order, each of them one customer's.
PER_ORDER_GROUPS = [
    "SELECT l_orderkey, SUM(l_price) AS revenue FROM lineitem GROUP BY l_orderkey",
    "SELECT o_orderkey, o_priority, COUNT(*) AS n FROM orders JOIN lineitem "
    "ON l_orderkey = o_orderkey GROUP BY o_orderkey, o_priority",
]


@pytest.mark.parametrize("sql", PER_ORDER_GROUPS)
def test_groups_of_one_persons_rows_are_refused_before_the_debit(served, sql):
    """Grouped by a key within one person (an order), every group is one customer's:
    refused as a list of individuals, saying what is answered instead, at no cost."""
    engine, _ = served
    with pytest.raises(Refused) as refused:
        engine.query("bo", {"sql": sql, "epsilon": 1.0, "fresh": True})
    said = str(refused.value)
    assert "holds one person's rows" in said and "SELECT n, COUNT(*) FROM (SELECT" in said
    assert "\n" not in said and len(said) < 300
    assert engine.ledger.spent("bo", "shop", "unnamed").epsilon == 0.0


def test_without_the_refusal_such_a_query_spends_its_epsilon_on_nothing(tmp_path, monkeypatch):
    """The version without the rule, under an accountant that allows partition
    selection: a key is kept only where enough persons share it, and an order has one,
    so the query is charged and releases no row (what the refusal spares the user)."""
    policy = _build(tmp_path)
    text = policy.read_text().replace("[gate]\n", '[gate]\naccountant = "approx"\n')
    for budget in ("user_budget", "notebook_budget"):
        text = text.replace(f"{budget} = {{ epsilon = 1e6 }}",
                            f"{budget} = {{ epsilon = 1e6, delta = 1e-3 }}")  # fmt: skip
    policy.write_text(text)
    monkeypatch.setattr(resolve.Resolved, "within_unit", lambda self, node: False)
    engine = Engine(load_policy(policy))
    try:
        ask = {"sql": PER_ORDER_GROUPS[0], "epsilon": 1.0, "delta": 1e-6, "fresh": True}
        reply = engine.query("cy", ask)
    finally:
        engine.close()
    assert reply["rows"] == [] and reply["cost"]["epsilon"] == pytest.approx(1.0)
