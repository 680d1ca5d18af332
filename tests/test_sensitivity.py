"""Every computed sensitivity against brute force on small neighbouring datasets.

For random small tables and each neighbour of them (one privacy unit removed,
or one unit's rows replaced by other rows), the generated SQL is run on real
DuckDB and the L1 distance between the exact measurement vectors is compared
with the sensitivity the plan calibrates its noise to. The contribution
bounding is deterministic for a fixed seed, so the bound must hold seed by
seed, not just on average.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.sensitivity import Contribution, count_sensitivity, sum_sensitivity
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": -3, "upper": 5},
    "y": {"type": "float", "lower": 0.0, "upper": 2.5},
}
QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT g, COUNT(*) FROM t GROUP BY g",
    "SELECT g, COUNT(x), SUM(x) FROM t GROUP BY g",
    "SELECT SUM(y) FROM t WHERE x > 0",
    "SELECT g, AVG(y) FROM t GROUP BY g",
    "SELECT g, SUM(x * y - 1) FROM t GROUP BY g",
    "SELECT SUM(CASE WHEN x > 2 THEN y ELSE -x END) AS s FROM t WHERE g IN (0, 2) OR y IS NULL",
    "SELECT g, SUM(y / (x + 4)) FROM t GROUP BY g HAVING COUNT(*) > 1",
    "SELECT SUM(x / g) AS ratio, COUNT(y) FROM t",
    "SELECT g, SUM(LEAST(y, 1.0)), SUM(CASE WHEN x > 2 THEN 2 WHEN x < 0 THEN -x ELSE x END) "
    "FROM t GROUP BY g",
    "SELECT AVG(CASE WHEN y >= 1 OR x = 0 THEN 1 ELSE y END) FROM t",
    # Bounded per query after load (a unit's ranked rows may reach several groups):
    "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g",
    "SELECT g, COUNT(DISTINCT x), COUNT(DISTINCT pid) FROM t GROUP BY g",
]
ORDER = ["pid", "g", "x", "y"]

row = st.tuples(
    st.sampled_from([0, 1, 2, 3, None]),
    st.one_of(st.none(), st.integers(-10, 10)),
    st.one_of(st.none(), st.sampled_from([-5.0, 0.0, 0.5, 1.0, 2.5, 7.0]), st.floats(-5, 5)),
)
unit_rows = st.lists(row, min_size=0, max_size=5)
units = st.lists(unit_rows, min_size=1, max_size=4)


def _rows(per_unit: list[list[tuple]]) -> list[tuple]:
    return [(pid, *r) for pid, rows in enumerate(per_unit, start=1) for r in rows]


def _l1(a: list[int], b: list[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=units,
    replacement=unit_rows,
    query=st.sampled_from(QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    user_level=st.booleans(),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_sensitivity_bounds_every_neighbour(
    per_unit, replacement, query, neighbouring, user_level, max_partitions, max_rows, seed
):
    ds = dataset(
        COLUMNS,
        unit="pid" if user_level else None,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
    )
    p = make_plan(query, ds)
    con = duckdb.connect()
    rows = _rows(per_unit)
    load_table(con, "t", ORDER, rows)
    base = exact_vectors(p, con, seed)

    # A neighbour changes one privacy unit: a pid (user level) or a row (row level).
    if user_level:
        targets = [[r for r in rows if r[0] == pid] for pid in range(1, len(per_unit) + 1)]
    else:
        targets = [[r] for r in rows]
    for target in targets:
        kept = [r for r in rows if r not in target] if user_level else _without_one(rows, target[0])
        if neighbouring == "add_remove":
            neighbour = kept
        else:
            # Substitute: the unit's rows become other rows (a row-level unit has
            # one row, or none: our relation admits both).
            pid = target[0][0] if target else 99
            swap = replacement if user_level else replacement[:1]
            neighbour = kept + [(pid, *r) for r in swap]
        load_table(con, "t", ORDER, neighbour)
        other = exact_vectors(p, con, seed)
        for m in p.measurements:
            distance = _l1(base[m.name], other[m.name])
            assert distance <= m.noise.sensitivity, (query, m.label, distance)


def _without_one(rows: list[tuple], target: tuple) -> list[tuple]:
    out = list(rows)
    out.remove(target)
    return out


def test_worst_case_unit_reaches_the_count_bound():
    """A unit with many rows in many groups moves the counts by exactly k·m: the
    bound is tight, so the noise is not larger than it must be."""
    ds = dataset(COLUMNS, max_partitions=2, max_rows=2)
    p = make_plan("SELECT g, COUNT(*) FROM t GROUP BY g", ds)
    con = duckdb.connect()
    heavy = [(1, g, 0, 0.0) for g in (0, 1, 2) for _ in range(3)]
    others = [(2, 0, 1, 1.0), (3, 2, 1, 1.0)]
    load_table(con, "t", ORDER, heavy + others)
    with_unit = exact_vectors(p, con, seed=5)
    load_table(con, "t", ORDER, others)
    without = exact_vectors(p, con, seed=5)
    (m,) = p.measurements
    assert _l1(with_unit[m.name], without[m.name]) == m.noise.sensitivity == 4


def test_worst_case_unit_at_the_bounds_reaches_the_sum_bound():
    ds = dataset(COLUMNS, max_partitions=1, max_rows=3, neighbouring="substitute")
    p = make_plan("SELECT SUM(x) FROM t", ds)
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 99, 0.0)] * 4 + [(2, 0, 1, 0.0)])
    high = exact_vectors(p, con, seed=1)
    load_table(con, "t", ORDER, [(1, 0, -99, 0.0)] * 4 + [(2, 0, 1, 0.0)])
    low = exact_vectors(p, con, seed=1)
    (m,) = p.measurements
    # Clamped to [-3, 5], three rows kept: 15 versus -9.
    assert _l1(high[m.name], low[m.name]) == 24 == m.noise.sensitivity


@pytest.mark.parametrize(
    ("lower", "upper", "groups", "rows", "partitions", "add_remove", "substitute"),
    [
        (1, 1, 1, 1, 1, 1, 1),  # a row-level count
        (1, 1, 2, 3, 5, 6, 12),  # disjoint groups: a replacement touches 2k partitions
        (1, 1, 2, 3, 3, 6, 9),  # only 3 partitions exist
        (0, 10, 1, 2, 1, 20, 20),
        (-3, 5, 1, 3, 1, 15, 24),  # substitute: from 3·-3 to 3·5
        (-3, 5, 2, 1, 2, 10, 16),
    ],
)
def test_sensitivity_formulas(lower, upper, groups, rows, partitions, add_remove, substitute):
    c = Contribution.bounded(groups, rows, partitions)
    assert sum_sensitivity(lower, upper, c, "add_remove") == add_remove
    assert sum_sensitivity(lower, upper, c, "substitute") == substitute
    if lower == upper == 1:
        assert count_sensitivity(c, "substitute") == substitute
