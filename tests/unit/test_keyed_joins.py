"""Joins along keys (``sql/keyed.py``, ``dp/join_bounding.py``'s keyed rule): a scan
joined by its table's unique key completes each joined row once at most, so it keeps
its unit's first ``K`` ranks and multiplies nothing.

Which scans are keyed, on the shop's shapes; every customer removed from the shop
moves each measurement of a join along its links by at most its sensitivity, on the
generated SQL over tables prepared as the gate prepares them (the broken version, a
column that repeats taken for a key, is caught); and what it is for: a customer's
lines joined to their orders are all counted, where the product rule kept a few."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.policy import Dataset, load_policy
from dpmagic.gate.sql import keyed as keyed_module
from dpmagic.gate.sql.keyed import keyed
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.resolve import resolve
from dpmagic.gate.sql.trees import conjuncts
from tests import shop
from tests.gate_helpers import exact_vectors, insert_rows, make_plan, sized

ALONG = [
    "SELECT o_priority, COUNT(*) AS n, SUM(l_quantity) AS q FROM lineitem "
    "JOIN orders ON l_orderkey = o_orderkey GROUP BY o_priority",
    "SELECT c_segment, COUNT(*) AS n FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
    "JOIN customer ON o_custkey = c_custkey GROUP BY c_segment",
    "SELECT COUNT(*) AS n, SUM(o_total) AS t FROM lineitem l JOIN orders o "
    "ON l.l_orderkey = o.o_orderkey WHERE l.l_quantity > 10",
    "SELECT COUNT(*) AS n FROM orders LEFT JOIN lineitem ON l_orderkey = o_orderkey "
    "AND l_flag = 'A'",
    "SELECT COUNT(*) AS n FROM lineitem l JOIN orders o1 ON l.l_orderkey = o1.o_orderkey "
    "JOIN orders o2 ON l.l_orderkey = o2.o_orderkey",
    "SELECT COUNT(*) AS n FROM orders o JOIN lineitem l ON l.l_orderkey = o.o_orderkey",
    "SELECT COUNT(*) AS n FROM lineitem l1 JOIN lineitem l2 ON l1.l_orderkey = l2.l_orderkey",
    "SELECT COUNT(*) AS n FROM orders o1 JOIN orders o2 ON o1.o_custkey = o2.o_custkey",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("keyed")
    shop.build(out / "shop.duckdb", customers=10, seed=3)
    (out / "shop.toml").write_text(shop.policy_text(out / "shop.duckdb", out / "state"))
    return out


def _dataset(folder: Path, rows: int, partitions: int = 2) -> Dataset:
    ds = load_policy(folder / "shop.toml").datasets["shop"]
    return sized(replace(ds, max_rows_per_partition=rows, max_partitions=partitions))


def _keyed(ds: Dataset, sql: str) -> list[tuple[str, bool]]:
    """Each private scan's table, in the join's order, and whether it is keyed."""
    resolved = resolve(parse(sql), ds)
    where = resolved.tree.args.get("where")
    terms = conjuncts(where.this) if where is not None else []
    private = [s for s in resolved.scans if not s.table.public]
    flags = keyed(private, terms, ds)
    return [(s.table.name, f) for s, f in zip(private, flags, strict=True)]


def test_which_scans_are_keyed(folder):
    ds = _dataset(folder, 3)
    assert _keyed(ds, ALONG[0]) == [("lineitem", False), ("orders", True)]
    # A customer is the unit's own row, not a key a link names: the product rule's
    # factor for it is its one row.
    assert _keyed(ds, ALONG[1]) == [("lineitem", False), ("orders", True), ("customer", False)]
    # An equality in another scan's LEFT JOIN condition keys nothing: orders' rows
    # without a line are kept there, one NULL row each.
    assert _keyed(ds, ALONG[3]) == [("orders", False), ("lineitem", False)]
    assert _keyed(ds, ALONG[4]) == [("lineitem", False), ("orders", True), ("orders", True)]
    # The order is keyed to its line, whichever is named first; a line's order key
    # repeats among lines, so a join on it keys no line.
    assert _keyed(ds, ALONG[5]) == [("orders", True), ("lineitem", False)]
    assert _keyed(ds, ALONG[6]) == [("lineitem", False), ("lineitem", False)]
    assert _keyed(ds, ALONG[7]) == [("orders", False), ("orders", False)]  # on the unit


def _without(con: duckdb.DuckDBPyConnection, customer: int) -> duckdb.DuckDBPyConnection:
    other = duckdb.connect()
    for table in ("customer", "orders", "lineitem", "part"):
        rows = con.execute(f"SELECT * FROM {table}").fetchall()
        columns = [d[0] for d in con.execute(f"SELECT * FROM {table} LIMIT 0").description]
        types = [t for _, t, *_ in con.execute(f"DESCRIBE {table}").fetchall()]
        spec = ", ".join(f"{c} {t}" for c, t in zip(columns, types, strict=True))
        other.execute(f"CREATE TABLE {table} ({spec})")
        insert_rows(other, table, rows)
    other.execute(
        f"DELETE FROM lineitem WHERE l_orderkey IN "
        f"(SELECT o_orderkey FROM orders WHERE o_custkey = {customer})"
    )
    other.execute(f"DELETE FROM orders WHERE o_custkey = {customer}")
    other.execute(f"DELETE FROM customer WHERE c_custkey = {customer}")
    return other


def _within_sensitivity(folder: Path, sql: str, seed: int = 5) -> None:
    """Every customer removed in turn moves each measurement by at most its
    sensitivity."""
    ds = _dataset(folder, 3)
    p = make_plan(sql, ds)
    source = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    try:
        con = _without(source, customer=0)  # a copy the preparation may write into
        base = exact_vectors(p, con, seed)
        (customers,) = zip(
            *source.execute("SELECT c_custkey FROM customer").fetchall(), strict=True
        )
        for c in customers:
            other = exact_vectors(p, _without(source, c), seed)
            for m in p.measurements:
                moved = sum(abs(a - b) for a, b in zip(base[m.name], other[m.name], strict=True))
                assert moved <= m.noise.sensitivity + 1e-9, (sql, m.label, c, moved)
    finally:
        source.close()


@pytest.mark.search
@pytest.mark.parametrize("sql", ALONG)
def test_removing_a_customer_moves_a_keyed_join_within_its_sensitivity(folder, sql):
    _within_sensitivity(folder, sql)


@pytest.mark.search
def test_a_scan_keyed_without_a_key_is_caught(folder, monkeypatch):
    """The broken version: every scan after the first taken for keyed, whatever its
    join. Two of a customer's orders joined on the customer then each keep ``K``
    rows: ``K²`` joined rows, past the ``K`` the sensitivity is of."""
    monkeypatch.setattr(keyed_module, "keyed", lambda scans, *a: [i > 0 for i in range(len(scans))])
    with pytest.raises(AssertionError):
        _within_sensitivity(folder, ALONG[7])


def test_a_customers_lines_joined_to_their_orders_are_all_counted(folder, monkeypatch):
    """With ``K`` above every customer's lines, the keyed rule keeps them all: the count
    of lines joined to their orders is the raw count. The product rule left most out
    (an order kept for every ``K // lines`` of a customer's lines)."""
    ds = _dataset(folder, 30, partitions=1)
    sql = "SELECT COUNT(*) AS n FROM lineitem JOIN orders ON l_orderkey = o_orderkey"
    source = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    try:
        (raw,) = source.execute(sql).fetchone()
        keyed_count = exact_vectors(make_plan(sql, ds), _without(source, 0), 1)
        monkeypatch.setattr(keyed_module, "keyed", lambda scans, *a: [False] * len(scans))
        product_count = exact_vectors(make_plan(sql, ds), _without(source, 0), 1)
    finally:
        source.close()
    (name,) = keyed_count
    assert keyed_count[name] == [raw]
    assert product_count[name][0] < raw
