"""Cases for searching sensitivities by brute force: the small tables, the queries
over them and the generators of units, shared by the tests that search each
sensitivity (L1, L2, the bounding report) against neighbouring datasets."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import duckdb
from hypothesis import strategies as st

from tests.gate_helpers import load_table

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": -3, "upper": 5},
    "y": {"type": "float", "lower": 0.0, "upper": 2.5},
}
# The same columns declared away from 0: a bare one's average is then centred on the
# middle of its bounds alone (``dp.centred_sums``, ``exact``), an expression's on the
# middle of the bounds with 0 added.
OFFSET = {**COLUMNS, "x": {"type": "int", "lower": 2, "upper": 9},
          "y": {"type": "float", "lower": 0.5, "upper": 3.0}}  # fmt: skip
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
    # Centred sums: around 1 of [-3, 5]; in half units around 1/2 of [0, 1]; around 4.
    "SELECT g, AVG(x) FROM t GROUP BY g",
    "SELECT AVG(CASE WHEN x > 0 THEN 1 ELSE 0 END), COUNT(x) FROM t",
    "SELECT g, AVG(x + 3), VAR_SAMP(x + 3), STDDEV_POP(y) FROM t GROUP BY g",
    "SELECT g, COUNT(DISTINCT x), COUNT(DISTINCT pid) FROM t GROUP BY g",
    "SELECT VAR_POP(x), STDDEV_SAMP(y) FROM t WHERE g <> 1",
    "SELECT g, MEDIAN(x), MIN(y), quantile_cont(y, 0.9) FROM t GROUP BY g",
    "SELECT MAX(x) FILTER (WHERE g = 1), COUNT(*) FILTER (WHERE y > 1) FROM t",
    "SELECT x, COUNT(*), SUM(y) FROM t GROUP BY x",
    "SELECT CASE WHEN x < 0 THEN 'neg' ELSE 'pos' END AS sign, AVG(y) FROM t GROUP BY sign",
    "SELECT y > 1 AS big, x // 2 AS half, COUNT(*) FROM t GROUP BY big, half",
    "SELECT COUNT(*), SUM(z) FROM (SELECT x + 1 AS z FROM t WHERE y < 2) AS s WHERE z > 0",
    "WITH a AS (SELECT * FROM t WHERE g = 0), b AS (SELECT x * 2 AS x2 FROM a) "
    "SELECT SUM(x2) FROM b",
    # Bounded per query after load (a unit's ranked rows may reach several groups):
    "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g",
]
ORDER = ["pid", "g", "x", "y"]

row = st.tuples(
    st.sampled_from([0, 1, 2, 3, None]),
    st.one_of(st.none(), st.integers(-10, 10)),
    st.one_of(
        st.none(),
        st.sampled_from([-5.0, 0.0, 0.5, 1.0, 2.5, 7.0, math.nan, math.inf, -math.inf]),
        st.floats(-5, 5),
    ),
)
unit_rows = st.lists(row, min_size=0, max_size=5)
units = st.lists(unit_rows, min_size=1, max_size=4)


def rows_of(per_unit: list[list[tuple]]) -> list[tuple]:
    return [(pid, *r) for pid, rows in enumerate(per_unit, start=1) for r in rows]


JOINED = {
    "u": {"columns": {"pid": {"type": "int"}, "z": {"type": "int", "lower": -2, "upper": 4}}},
    "pub": {
        "public": True,
        "columns": {
            "g": {"type": "int", "public_values": [0, 1, 2]},
            "w": {"type": "int", "lower": 0, "upper": 3},
        },
    },
}
PUBLIC_ROWS = [(0, 1), (0, 3), (1, 2), (2, 0), (2, 2), (2, 3)]  # g 0 and 2 match twice
JOIN_QUERIES = [
    "SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid",
    "SELECT t.g, SUM(u.z), COUNT(*) FROM t JOIN u ON t.pid = u.pid GROUP BY t.g",
    "SELECT COUNT(u.z), SUM(t.x) FROM t LEFT JOIN u ON t.pid = u.pid AND u.z > 0",
    "SELECT pub.w, COUNT(*), SUM(t.y) FROM t JOIN pub ON t.g = pub.g GROUP BY pub.w",
    "SELECT COUNT(*), SUM(a.x) FROM t AS a JOIN t AS b ON a.pid = b.pid",
    "SELECT MEDIAN(u.z), COUNT(DISTINCT t.pid) FROM u JOIN t USING (pid)",
    "SELECT g, AVG(z) FROM (SELECT t.g, u.z FROM t JOIN u ON t.pid = u.pid WHERE u.z >= 0) AS j "
    "GROUP BY g",
    "SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid JOIN pub ON pub.g = t.g WHERE pub.w > 1",
    "SELECT g, COUNT(*), SUM(x) FROM t WHERE pid IN (SELECT pid FROM u WHERE z > 0) GROUP BY g",
    "SELECT COUNT(*) FROM t WHERE pid NOT IN (SELECT u.pid FROM u JOIN pub ON u.z = pub.w)",
    "SELECT g, SUM(x) FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE t.pid = u.pid AND z < 0) "
    "GROUP BY g",
    "SELECT COUNT(*), SUM(k.zz), MAX(k.zz) FROM t LEFT JOIN "
    "(SELECT pid, COALESCE(z, 0) + 1 AS zz FROM u WHERE z > 0) AS k ON t.pid = k.pid",
    "SELECT pub.w, COUNT(*), COUNT(DISTINCT t.pid) FROM t CROSS JOIN pub GROUP BY pub.w",
    # Private tables only: bounded by the ranks and counts stored at load, no window.
    "SELECT COUNT(*) FROM u JOIN t ON u.pid = t.pid",
    "SELECT t.g, COUNT(*), SUM(c.x) FROM t JOIN u ON t.pid = u.pid JOIN t AS c ON c.pid = u.pid "
    "GROUP BY t.g",
    "SELECT t.g, COUNT(v.z), SUM(u.z) FROM t LEFT JOIN u ON t.pid = u.pid "
    "LEFT JOIN u AS v ON v.pid = t.pid AND v.z > 0 GROUP BY t.g",
    "SELECT COUNT(*) FROM t AS a JOIN t AS b ON a.pid = b.pid JOIN t AS c ON c.pid = a.pid "
    "JOIN u ON u.pid = c.pid WHERE a.x < b.x",
]
joined_unit = st.tuples(unit_rows, st.lists(st.one_of(st.none(), st.integers(-5, 6)), max_size=4))


def joined_neighbours(
    per_unit: list[tuple], replacement: tuple, neighbouring: str, measure: Callable
) -> Iterator[tuple]:
    """``measure(con)`` on the tables ``t`` and ``u`` of ``per_unit``'s units (each a
    pair: its rows of ``t``, its values of ``u``) beside the public ``pub``, paired with
    ``measure`` on each neighbour: one unit removed, or under ``substitute`` replaced
    by ``replacement``."""
    con = duckdb.connect()
    load_table(con, "pub", ["g", "w"], PUBLIC_ROWS)

    def load(units: dict[int, tuple]):
        load_table(con, "t", ORDER, [(pid, *r) for pid, (rows, _) in units.items() for r in rows])
        load_table(con, "u", ["pid", "z"], [(pid, z) for pid, (_, zs) in units.items() for z in zs])
        return measure(con)

    units = dict(enumerate(per_unit, start=1))
    base = load(units)
    for pid in units:
        others = {k: v for k, v in units.items() if k != pid}
        if neighbouring == "substitute":
            others[pid] = replacement
        yield base, load(others)


@st.composite
def compared_exists(draw) -> tuple[str, bool]:
    """A ``[NOT] EXISTS`` over ``t`` (again, as ``b``) or ``u`` that compares its rows
    with the query's row beside its tie, and whether the tie keeps both rows one
    person's (on ``pid``); the others (on ``g`` or ``x``) read other persons' rows."""
    inner, alias = draw(st.sampled_from([("t AS b", "b"), ("u", "u")]))
    if alias == "b":
        key = draw(st.sampled_from(["pid", "pid", "g", "x"]))
        tie, person = f"b.{key} = t.{key}", key == "pid"
        compared = ["b.x < t.x", "b.y <> t.y", "b.g = t.g", "b.x + t.x > 2", "b.y >= t.y * 2"]
    else:
        tie, person = draw(st.sampled_from([("u.pid = t.pid", True), ("u.z = t.x", False)]))
        compared = ["u.z > t.x", "u.z <> t.g", "u.z * t.y < 3"]
    extra = draw(st.lists(st.sampled_from(compared), min_size=1, max_size=2, unique=True))
    conditions = [tie, *extra]
    if draw(st.booleans()):
        conditions.reverse()  # the tie need not come first
    negated = "NOT " if draw(st.booleans()) else ""
    where = " AND ".join(conditions)
    select = draw(st.sampled_from(["g, COUNT(*), SUM(x)", "COUNT(*), SUM(y)"]))
    group = " GROUP BY g" if select.startswith("g,") else ""
    return (
        f"SELECT {select} FROM t WHERE {negated}EXISTS (SELECT 1 FROM {inner} WHERE {where})"
        + group,
        person,
    )
