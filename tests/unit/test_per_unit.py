"""Per-person pre-aggregation's bounds (``sql/per_unit.py``), searched by brute force:
every dataset of one person's rows (up to the row bound, values at the declared
bounds, 0 and NULL) is one person of a real DuckDB table, and every per-person value
the engine computes must lie within the bound decided from the text alone. The
broken rule (a SUM bounded by the column's range, not rows × range) is caught."""

from __future__ import annotations

import itertools
import math

import duckdb
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Column, Table
from dpmagic.gate.sql import per_unit
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.per_unit import (
    PerUnitValue,
    WithinUnit,
    derived_table,
    grouped_by_unit,
    keys_of,
    per_unit_values,
)
from dpmagic.gate.sql.value_range import ValueRange
from tests.gate_helpers import (
    dataset,
    exact_vectors,
    insert_rows,
    load_table,
    make_plan,
    neighbours,
)

ROWS = 3  # a person's row bound (the table's max_rows)
RANGES = {"x": ValueRange(-3, 5, True), "y": ValueRange(0.0, 2.5, False)}
X_VALUES = (-3, 0, 5, None)
Y_VALUES = (0.0, 2.5, None)
QUERIES = [
    "SELECT pid, COUNT(*) AS n, COUNT(x) AS cx, COUNT(DISTINCT x) AS dx, SUM(x) AS sx, "
    "SUM(y) AS sy, AVG(x) AS ax, MIN(y) AS mny, MAX(x) AS mxx, "
    "LEAST(GREATEST(SUM(x), 0), 4) AS clamped, GREATEST(MIN(x), -1) AS floor "
    "FROM t GROUP BY pid",
    "SELECT t.pid, SUM(x) AS sx, COUNT(*) AS n FROM t WHERE x > 0 GROUP BY t.pid "
    "HAVING COUNT(*) > 1",
    # LEFT JOIN from the persons' own table keeps persons without rows.
    "SELECT p.pid, COUNT(t.x) AS n, SUM(t.x) AS sx, SUM(t.y) AS sy "
    "FROM persons AS p LEFT JOIN t ON p.pid = t.pid GROUP BY p.pid",
]


def unit_column(unit: str, table: str | None = None) -> WithinUnit:
    """The predicate the resolver gives for a unit column, here by name alone:
    ``pid`` (or ``t.pid``) lies within one unit because it names it."""

    def within(key: sqlglot.exp.Expression) -> bool:
        while isinstance(key, sqlglot.exp.Paren):
            key = key.this
        if not isinstance(key, sqlglot.exp.Column) or key.name.lower() != unit.lower():
            return False
        return not key.table or table is None or key.table.lower() == table.lower()

    return within


def _row_range(node: sqlglot.exp.Expression) -> ValueRange | None:
    return RANGES.get(node.name) if isinstance(node, sqlglot.exp.Column) else None


@pytest.fixture(scope="module")
def people() -> duckdb.DuckDBPyConnection:
    """One person per dataset of at most ``ROWS`` rows: 1 + 12 + 144 + 1728 persons."""
    rows = [(x, y) for x in X_VALUES for y in Y_VALUES]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pid INTEGER, x INTEGER, y DOUBLE)")
    con.execute("CREATE TABLE persons (pid INTEGER)")
    data, pid = [], 0
    for k in range(ROWS + 1):
        for person in itertools.product(rows, repeat=k):
            data.extend((pid, x, y) for x, y in person)
            pid += 1
    insert_rows(con, "t", data)
    con.execute("INSERT INTO persons SELECT range FROM range(?)", [pid])
    return con


def _violations(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every per-person value outside its bound, over every query and person."""
    found = []
    for sql in QUERIES:
        select = sqlglot.parse_one(sql, dialect=DIALECT)
        values = per_unit_values(select, ROWS, unit_column("pid"), _row_range)
        names = [d[0] for d in con.execute(sql).description]
        for row in con.execute(sql).fetchall():
            for v in values:
                got = row[names.index(v.name)]
                r = v.range
                if got is None:
                    continue
                if not r.lo - 1e-9 <= got <= r.hi + 1e-9 or (r.integral and got != int(got)):
                    found.append(f"{v.name}={got} outside [{r.lo}, {r.hi}] in {sql}")
    return found


def test_every_per_person_value_within_its_bound(people: duckdb.DuckDBPyConnection) -> None:
    assert _violations(people) == []


def test_the_search_catches_a_sum_bounded_by_the_column_range(
    people: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken rule: SUM(x) within x's declared range, as if a person had one row."""
    real = per_unit.value_bound

    def broken(
        node: sqlglot.exp.Expression, rows: int, row_range: per_unit.RowRange
    ) -> tuple[ValueRange, str] | None:
        return (
            real(node, 1, row_range)
            if isinstance(node, sqlglot.exp.Sum)
            else real(node, rows, row_range)
        )

    monkeypatch.setattr(per_unit, "value_bound", broken)
    assert any(v.startswith("sx=") for v in _violations(people))


def test_the_bounds_are_tight(people: duckdb.DuckDBPyConnection) -> None:
    """The search reaches each bound, so it would see a bound one step too small
    (COUNT(*)'s 0, a person without rows, is reached by the LEFT JOIN query only)."""
    sql = QUERIES[0]
    values = per_unit_values(sqlglot.parse_one(sql), ROWS, unit_column("pid"), _row_range)
    got = people.execute(sql).fetchall()
    names = [d[0] for d in people.execute(sql).description]
    for v in values:
        column = [row[names.index(v.name)] for row in got if row[names.index(v.name)] is not None]
        assert math.isclose(max(column), v.range.hi)
        assert math.isclose(min(column), v.range.lo) or v.name == "n"


def test_the_dry_run_basis_names_rows_and_range() -> None:
    select = sqlglot.parse_one("SELECT pid, SUM(x) AS s, COUNT(*) AS n FROM t GROUP BY pid")
    s, n = per_unit_values(select, ROWS, unit_column("pid"), _row_range)
    assert s == PerUnitValue("s", ValueRange(-9, 15, True), "SUM(x) in [-9, 15]: 3 rows per "
                             "unit × [-3, 5]")  # fmt: skip
    assert n.range == ValueRange(0, 3, True) and "3 rows per unit" in n.basis


def test_an_integer_per_person_value_offers_its_keys() -> None:
    select = sqlglot.parse_one("SELECT pid, COUNT(*) AS n, AVG(x) AS a FROM t GROUP BY pid")
    n, a = per_unit_values(select, ROWS, unit_column("pid"), _row_range)
    assert list(keys_of(n)) == [0, 1, 2, 3]
    with pytest.raises(Refused, match="cannot be a key"):
        keys_of(a)
    with pytest.raises(Refused, match="clamp it"):
        keys_of(PerUnitValue("big", ValueRange(0, per_unit.MAX_KEYS, True), ""))


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT g, COUNT(*) FROM t GROUP BY g", "must group by the privacy unit"),
        ("SELECT pid, SUM(z) FROM t GROUP BY pid", "no bound per person"),
        ("SELECT pid, SUM(x) * 2 FROM t GROUP BY pid", "no bound per person"),
        ("SELECT q.pid, COUNT(*) FROM t GROUP BY q.pid", "must group by the privacy unit"),
    ],
)
def test_refused_without_a_bound(sql: str, message: str) -> None:
    with pytest.raises(Refused, match=message):
        per_unit_values(sqlglot.parse_one(sql), ROWS, unit_column("pid", "t"), _row_range)


def test_the_unit_predicate() -> None:
    within = unit_column("patient_id", "visits")
    grouped = sqlglot.parse_one("SELECT COUNT(*) FROM visits GROUP BY visits.patient_id")
    assert grouped_by_unit(grouped, within)
    assert not grouped_by_unit(sqlglot.parse_one("SELECT 1 FROM visits GROUP BY ward"), within)
    assert not grouped_by_unit(sqlglot.parse_one("SELECT 1 FROM visits"), within)


def test_the_derived_table_declares_one_row_per_person_within_the_bounds() -> None:
    """Clinic's shape: visits per patient, as the outer query's declared table."""
    select = sqlglot.parse_one(
        "SELECT patient_id, COUNT(*) AS n, AVG(cost) AS a FROM visits GROUP BY patient_id"
    )
    cost = {"cost": ValueRange(0.0, 500.0, False)}
    values = per_unit_values(select, 20, unit_column("patient_id"), lambda c: cost.get(c.name))
    table = derived_table("per_patient", Column("patient_id", "int"), values)
    assert table.unit == "patient_id" and table.max_rows == 1 and not table.public
    n, a = table.columns["n"], table.columns["a"]
    assert (n.type, n.lower, n.upper, n.public_values) == ("int", 0, 20, tuple(range(21)))
    assert (a.type, a.lower, a.upper, a.public_values) == ("float", 0.0, 500.0, None)


INNER = "SELECT pid, COUNT(*) AS n, SUM(x) AS sx, AVG(y) AS a FROM t GROUP BY pid"
OUTER = [
    "SELECT COUNT(*), SUM(n), AVG(n) FROM pp",
    "SELECT n, COUNT(*), SUM(sx) FROM pp GROUP BY n",
    "SELECT AVG(a), SUM(sx), MEDIAN(n) FROM pp",
]
in_range_row = st.tuples(
    st.one_of(st.none(), st.integers(-3, 5)),
    st.one_of(st.none(), st.sampled_from([0.0, 2.5]), st.floats(0.0, 2.5)),
)
person = st.lists(in_range_row, max_size=5)


def _per_person(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    """The per-person subquery materialised as ``pp``, each person's rows first capped
    at ``ROWS`` (as the contribution bounding caps them before the aggregation)."""
    load_table(con, "t", ["pid", "x", "y"], rows)
    capped = INNER.replace(
        "FROM t", f"FROM (SELECT * FROM t QUALIFY ROW_NUMBER() OVER (PARTITION BY pid) <= {ROWS})"
    )
    con.execute("DROP TABLE IF EXISTS pp")
    con.execute(
        "CREATE TABLE pp AS SELECT pid::BIGINT AS pid, n::BIGINT AS n, sx::BIGINT AS sx, "
        f"a::DOUBLE AS a FROM ({capped})"
    )


def _outside(con: duckdb.DuckDBPyConnection, table: Table) -> int:
    """The per-person values outside their declared bounds: the gate clamps a loaded
    table into its bounds, which would hide a bound too small, so none may be."""
    conds = [
        f"{c.name} NOT BETWEEN {c.lower} AND {c.upper}" for c in table.columns.values() if c.bounded
    ]
    return con.execute(f"SELECT COUNT(*) FROM pp WHERE {' OR '.join(conds)}").fetchone()[0]


@pytest.mark.search
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=st.lists(person, min_size=1, max_size=4),
    replacement=person,
    query=st.sampled_from(OUTER),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    seed=st.integers(0, 2**62),
)
def test_the_query_around_a_per_person_subquery_stays_within_its_sensitivity(
    per_unit: list[list[tuple]], replacement: list[tuple], query: str, neighbouring: str, seed: int
) -> None:
    """The gate's planner over ``derived_table``'s declaration, run on the per-person
    values of each neighbour (one person removed or replaced): every measurement moves
    by at most its sensitivity. Composes the bounds above with the planner's rules."""
    values = per_unit_values(sqlglot.parse_one(INNER), ROWS, unit_column("pid"), _row_range)
    table = derived_table("pp", Column("pid", "int"), values)
    columns = {name: c.as_dict() for name, c in table.columns.items()}
    ds = dataset(
        columns, table="pp", neighbouring=neighbouring, table_options={"max_rows_per_unit": 1}
    )
    p = make_plan(query, ds)
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    _per_person(con, rows)
    assert _outside(con, table) == 0
    base = exact_vectors(p, con, seed)
    for neighbour in neighbours(rows, len(per_unit), True, neighbouring, replacement):
        _per_person(con, neighbour)
        assert _outside(con, table) == 0
        other = exact_vectors(p, con, seed)
        for m in p.measurements:
            moved = sum(abs(a - b) for a, b in zip(base[m.name], other[m.name], strict=True))
            assert moved <= m.noise.sensitivity + 1e-9, (query, m.label, moved)


def test_tpch_q13_shape_offers_the_order_counts_as_keys() -> None:
    """TPC-H query 13's inner query (names inside the SELECT): a customer's orders
    counted, customers without orders kept by the LEFT JOIN, the count a key 0..rows."""
    select = sqlglot.parse_one(
        "SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM customer LEFT OUTER JOIN orders "
        "ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%' GROUP BY c_custkey"
    )
    (count,) = per_unit_values(select, 7, unit_column("c_custkey"), lambda _: None)
    assert count.name == "c_count" and list(keys_of(count)) == list(range(8))
