"""Per-table contribution bounds: ``max_rows_per_unit`` in a table's declaration.

A table of one row per person counts with sensitivity 1 instead of the dataset's
``max_partitions × max_rows_per_partition``: the plan's ``K`` (and the window's
bounds) are cut to the product of the joined tables' declared rows per unit
(``ranks.table_cap``). The bound holds by construction even where the data
breaks the declaration: brute force over neighbouring datasets whose units hold
more rows than declared, seed by seed, on real DuckDB; and the version that trusts
the declaration without bounding by it (the plan's ``K`` cut, the SQL's left as
it was) is caught.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.policy import PolicyError, parse_policy
from dpmagic.gate.sql import rewrite as rewrites
from dpmagic.gate.sql.ranks import Ranked, Window
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan, neighbours

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": 0, "upper": 5},
}
ORDER = ["pid", "g", "x"]
QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g",
    "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g",
    "SELECT AVG(x) FROM t WHERE g > 0",
]


def _ds(declared: int | None, max_partitions: int = 3, max_rows: int = 3):
    options = {} if declared is None else {"max_rows_per_unit": declared}
    return dataset(COLUMNS, max_partitions=max_partitions, max_rows=max_rows,
                   table_options=options)  # fmt: skip


def test_a_row_per_unit_table_counts_with_sensitivity_1() -> None:
    loose = make_plan("SELECT g, COUNT(*) FROM t GROUP BY g", _ds(None))
    tight = make_plan("SELECT g, COUNT(*) FROM t GROUP BY g", _ds(1))
    assert loose.measurements[0].sensitivity == 9
    assert tight.measurements[0].sensitivity == 1
    assert tight.bounding == Ranked(1)
    # the noise scale follows: 9× narrower at the same ε
    assert loose.measurements[0].scale == pytest.approx(9 * tight.measurements[0].scale)
    windowed = make_plan("SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g", _ds(2))
    assert windowed.bounding == Window(2, 2, 2)


def test_a_join_is_bounded_by_the_product_of_its_tables() -> None:
    more = {"u": {"columns": {"pid": {"type": "int"}}, "max_rows_per_unit": 2}}
    ds = dataset(COLUMNS, max_partitions=3, max_rows=3, more_tables=more,
                 table_options={"max_rows_per_unit": 1})  # fmt: skip
    p = make_plan("SELECT COUNT(*) FROM t JOIN u ON u.pid = t.pid", ds)
    assert p.bounding == Ranked(2)
    # a table without a declaration leaves the dataset's bounds
    ds = dataset(COLUMNS, max_partitions=3, max_rows=3, table_options={"max_rows_per_unit": 1},
                 more_tables={"u": {"columns": {"pid": {"type": "int"}}}})  # fmt: skip
    assert make_plan("SELECT COUNT(*) FROM t JOIN u ON u.pid = t.pid", ds).bounding == Ranked(3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "datasets.d.tables.t.max_rows_per_unit must be at least 1"),
        (1.5, "datasets.d.tables.t.max_rows_per_unit must be a whole number"),
        (True, "datasets.d.tables.t.max_rows_per_unit must be a whole number"),
    ],
)
def test_a_bad_declaration_is_refused(value, message) -> None:
    raw = {
        "datasets": {
            "d": {
                "sources": {"t": "t.csv"},
                "privacy_unit": "pid",
                "user_budget": {"epsilon": 1.0},
                "tables": {"t": {"columns": COLUMNS, "max_rows_per_unit": value}},
            }
        }
    }
    with pytest.raises(PolicyError, match=message):
        parse_policy(raw, Path("p.toml"))


row = st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 5))
units = st.lists(st.lists(row, min_size=0, max_size=5), min_size=1, max_size=4)


def _l1(a: list, b: list) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def _worst_move(query: str, declared: int, per_unit, seed: int) -> tuple[int, int]:
    """The largest L1 move of the first measurement over every neighbour, and its
    sensitivity."""
    p = make_plan(query, _ds(declared))
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    load_table(con, "t", ORDER, rows)
    base = exact_vectors(p, con, seed)
    m = p.measurements[0]
    worst = 0
    for other_rows in neighbours(rows, len(per_unit), True, "add_remove", []):
        load_table(con, "t", ORDER, other_rows)
        worst = max(worst, _l1(base[m.name], exact_vectors(p, con, seed)[m.name]))
    return worst, m.noise.sensitivity


@pytest.mark.search
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(per_unit=units, query=st.sampled_from(QUERIES), declared=st.integers(1, 2),
       seed=st.integers(0, 2**62))  # fmt: skip
def test_the_bound_holds_where_the_data_breaks_the_declaration(per_unit, query, declared, seed):
    worst, sensitivity = _worst_move(query, declared, per_unit, seed)
    assert worst <= sensitivity


def test_trusting_the_declaration_without_bounding_by_it_is_caught(monkeypatch) -> None:
    """The broken version: the plan's K cut to the declaration, the SQL still reading
    the dataset's K rows of a unit (as if the data kept its word)."""
    true_cap = rewrites.join_cap
    monkeypatch.setattr(rewrites, "join_cap", lambda b: 9 if isinstance(b, Ranked) else true_cap(b))
    heavy = [[(0, 1)] * 5, [(1, 2)]]  # a unit with five rows in a table declared one
    worst, sensitivity = _worst_move("SELECT COUNT(*) FROM t", 1, heavy, seed=3)
    assert sensitivity == 1 and worst > sensitivity
