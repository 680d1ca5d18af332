"""Per-person pre-aggregation through the whole analysis: a subquery grouped by the
privacy unit is computed per person in SQL of its own, each value clamped into its
bound, and read by the query around it as a table of one row per person.

Searched by brute force: every measurement of the query around it moves by at most
its sensitivity when one person is removed or replaced, on the generated SQL run on
tables prepared as the gate prepares them. The broken version (a per-person SUM
declared within the column's range, not rows × range, and not clamped) is caught.
Then on a real engine over the shop: the histogram of orders per customer, an average
of per-customer totals and TPC-H query 13's shape answer near the truth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.engine import Engine
from dpmagic.gate.engines import ranking
from dpmagic.gate.failures import GateError, Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.sql import per_unit, rewrite
from dpmagic.gate.sql.value_range import ValueRange
from tests import shop
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan, neighbours

COLUMNS = {
    "pid": {"type": "int"},
    "x": {"type": "int", "lower": -3, "upper": 5},
    "y": {"type": "float", "lower": 0.0, "upper": 2.5},
}
QUERIES = [
    "SELECT n, COUNT(*) AS c FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) AS p GROUP BY n",
    "SELECT SUM(sx) AS s, AVG(a) AS a FROM "
    "(SELECT pid, SUM(x) AS sx, AVG(y) AS a FROM t GROUP BY pid) AS p",
    "SELECT COUNT(*) AS c FROM (SELECT pid, SUM(x) AS sx FROM t WHERE x > 0 GROUP BY pid) "
    "AS p WHERE sx > 2",
    "SELECT g, COUNT(*) AS c, SUM(n) AS s FROM "
    "(SELECT pid, COUNT(*) AS n, MAX(x) AS g FROM t GROUP BY pid) AS p GROUP BY g",
    "SELECT SUM(c) AS s FROM (SELECT pid, LEAST(GREATEST(SUM(x), 0), 4) AS c FROM t "
    "GROUP BY pid) AS p",
    # The persons (or keys within one person) whose rows meet a condition, in a semi-join.
    "SELECT COUNT(*) AS c, SUM(x) AS s FROM t WHERE pid IN (SELECT pid FROM t GROUP BY pid "
    "HAVING COUNT(*) > 2 AND SUM(x) > 0)",
    # HAVING filters persons: by a value selected, and by one it alone reads.
    "SELECT COUNT(*) AS c, SUM(n) AS s FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid "
    "HAVING n > 1 AND SUM(x) > 2) AS p",
]
row = st.tuples(st.sampled_from([-3, 0, 2, 5, None]), st.sampled_from([0.0, 1.25, 2.5, None]))
person = st.lists(row, min_size=1, max_size=6)  # past the load cap of 2 × 2 rows


@pytest.mark.search
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    people=st.lists(person, min_size=1, max_size=4),
    replacement=person,
    query=st.sampled_from(QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    seed=st.integers(0, 2**62),
)
def test_the_query_around_a_per_person_subquery_stays_within_its_sensitivity(
    people: list[list[tuple]], replacement: list[tuple], query: str, neighbouring: str, seed: int
) -> None:
    _within_sensitivity(people, replacement, query, neighbouring, seed)


def _within_sensitivity(
    people: list[list[tuple]], replacement: list[tuple], query: str, neighbouring: str, seed: int
) -> None:
    ds = dataset(COLUMNS, neighbouring=neighbouring)
    p = make_plan(query, ds)
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(people, start=1) for r in rs]
    load_table(con, "t", ["pid", "x", "y"], rows)
    base = exact_vectors(p, con, seed)
    for neighbour in neighbours(rows, len(people), True, neighbouring, replacement):
        load_table(con, "t", ["pid", "x", "y"], neighbour)
        other = exact_vectors(p, con, seed)
        for m in p.measurements:
            moved = sum(abs(a - b) for a, b in zip(base[m.name], other[m.name], strict=True))
            assert moved <= m.noise.sensitivity + 1e-9, (query, m.label, moved)


def test_a_sum_bounded_by_the_column_range_and_not_clamped_is_caught(monkeypatch) -> None:
    """The broken version: a per-person SUM declared within its column's range (not
    rows × range), and the SQL's clamp into the bound gone. One person's four rows of 5
    sum to 20, past the declared 5: the outer sum moves by more than its sensitivity."""
    honest = per_unit.value_bound

    def narrow(node, rows, row_range):
        found = honest(node, rows, row_range)
        if found is not None and node.key == "sum":
            arg = row_range(node.this)
            return arg, "the column's range (broken)"
        return found

    monkeypatch.setattr(per_unit, "value_bound", narrow)
    monkeypatch.setattr(rewrite, "clamped", lambda value, bounds: value)
    people = [[(5, 0.0)] * 4, [(0, 0.0)]]
    with pytest.raises(AssertionError, match="SUM"):
        _within_sensitivity(people, [], QUERIES[1], "add_remove", seed=3)
    monkeypatch.undo()
    _within_sensitivity(people, [], QUERIES[1], "add_remove", seed=3)


def test_each_value_is_clamped_into_its_bound_in_the_sql() -> None:
    p = make_plan(QUERIES[1], dataset(COLUMNS))
    sql = rewrite.rewrite(p, seed=1).sql
    # SUM(x) of at most 4 rows in [-3, 5] lies in [-12, 20]: the SQL says so.
    assert "-12" in sql and "20" in sql
    assert ranking.load_cap(p.dataset) == 4


def test_a_person_and_a_column_they_do_not_fix_make_a_row_for_each_value() -> None:
    """``GROUP BY pid, x``: a row per person and value of x, each one person's; the query
    around reads at most a person's row bound of them (``test_per_order.py`` has the
    neighbour brute force)."""
    sql = "SELECT COUNT(*) FROM (SELECT pid, x, COUNT(*) AS n FROM t GROUP BY pid, x) AS p"
    p = make_plan(sql, dataset(COLUMNS))
    (scan,) = [s for s in p.checked.resolved.scans if s.per_unit is not None]
    assert scan.table.max_rows == scan.per_unit.rows > 1
    assert "x" in scan.table.columns


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT COUNT(*) FROM (SELECT x, COUNT(*) AS n FROM t GROUP BY x) AS p",
         "must group by the privacy unit, or by a key within one person"),
        ("SELECT COUNT(*) FROM (SELECT pid, SUM(x * pid) AS n FROM t GROUP BY pid) AS p",
         "no bound per person"),
        ("SELECT COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid ORDER BY n "
         "LIMIT 3) AS p", "filter the persons in the query around it"),
        ("SELECT n FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) AS p GROUP BY pid",
         "privacy unit"),
    ],
)  # fmt: skip
def test_what_is_not_a_per_person_subquery_is_refused_with_why(sql: str, says: str) -> None:
    with pytest.raises(Refused, match=says):
        make_plan(sql, dataset(COLUMNS))


def test_an_integer_per_person_value_is_a_public_key() -> None:
    """Orders per customer as a histogram: the keys are 0..rows, known without the
    data, every one released, so the histogram is pure DP."""
    p = make_plan(QUERIES[0], dataset(COLUMNS))
    assert p.partitions == tuple((n,) for n in range(5))
    assert p.contribution.rows == 1  # one row a person in the query around it
    assert per_unit.keys_of(per_unit.PerUnitValue("n", ValueRange(0, 4, True), "")) == range(5)


# -- on a real engine over the shop -----------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shop")
    shop.build(out / "shop.duckdb")
    text = shop.policy_text(out / "shop.duckdb", out / "state")
    # Every customer's orders (at most 6) and lines (at most 24) within the bounds.
    text = text.replace("max_rows_per_partition = 8", "max_rows_per_partition = 30")
    (out / "shop.toml").write_text(text)
    return out


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Engine]:
    e = Engine(load_policy(folder / "shop.toml"))
    yield e
    e.close()


def _both(engine: Engine, folder: Path, sql: str, epsilon: float = 50.0):
    reply = engine.query("ann", {"sql": sql, "epsilon": epsilon, "fresh": True})
    con = duckdb.connect(str(folder / "shop.duckdb"), read_only=True)
    return reply, con.execute(sql).fetchall()


def test_orders_per_customer_answered_as_a_histogram(engine, folder) -> None:
    sql = (
        "SELECT n, COUNT(*) AS customers FROM (SELECT o_custkey, COUNT(*) AS n FROM orders "
        "GROUP BY o_custkey) AS per GROUP BY n ORDER BY n"
    )
    reply, truth = _both(engine, folder, sql)
    got = dict(reply["rows"])
    assert sorted(got) == list(range(121))  # 0..120 (4 × 30), each released
    for n, customers in truth:
        assert abs(got[n] - customers) <= 3
    assert sum(abs(c) for n, c in got.items() if n > 6) <= 3 * 114  # no orders past 6


def test_an_average_of_per_customer_totals_and_tpch_q13(engine, folder) -> None:
    reply, truth = _both(
        engine,
        folder,
        "SELECT AVG(total) FROM (SELECT o_custkey, SUM(o_total) AS total FROM orders "
        "GROUP BY o_custkey) AS per",
        epsilon=500.0,
    )
    assert reply["rows"][0][0] == pytest.approx(truth[0][0], rel=0.05)
    q13 = (
        "SELECT c_count, COUNT(*) AS custdist FROM (SELECT c_custkey, COUNT(o_orderkey) "
        "FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND "
        "o_priority <> '1-URGENT' GROUP BY c_custkey) AS c_orders (c_custkey, c_count) "
        "GROUP BY c_count ORDER BY custdist DESC, c_count DESC"
    )
    reply, truth = _both(engine, folder, q13)
    got = dict(reply["rows"])
    for count, customers in truth:
        assert abs(got[count] - customers) <= 3


def test_a_per_person_subquery_is_read_alone(engine) -> None:
    with pytest.raises(GateError, match="read on its own"):
        engine.query(
            "ann",
            {
                "sql": "SELECT COUNT(*) FROM customer JOIN (SELECT o_custkey, COUNT(*) AS n "
                "FROM orders GROUP BY o_custkey) AS p ON c_custkey = p.o_custkey",
                "epsilon": 1.0,
            },
        )


def test_orders_whose_lines_meet_a_condition_tpch_q18(engine, folder) -> None:
    """TPC-H query 18's shape: orders whose lines (all one customer's, reached along the
    order's key) sum past a quantity, as a semi-join grouped by the order."""
    sql = (
        "SELECT o_priority, COUNT(*) AS n FROM orders WHERE o_orderkey IN (SELECT l_orderkey "
        "FROM lineitem GROUP BY l_orderkey HAVING SUM(l_quantity) > 60) GROUP BY o_priority"
    )
    # A customer may have 30 rows in a priority here: noise of scale 90/ε per count.
    reply, truth = _both(engine, folder, sql, epsilon=2000.0)
    got = dict(reply["rows"])
    for priority, n in truth:
        assert abs(got[priority] - n) <= 3


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT COUNT(*) FROM orders WHERE o_orderkey IN (SELECT l_partkey FROM lineitem "
         "GROUP BY l_partkey HAVING COUNT(*) > 1)", "must group by the value it selects"),
        ("SELECT COUNT(*) FROM orders WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem "
         "GROUP BY l_orderkey HAVING SUM(l_quantity) * 2 > 60)", "MUL is not allowed in HAVING"),
        ("SELECT COUNT(*) FROM orders WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem "
         "GROUP BY l_orderkey HAVING MEDIAN(l_quantity) > 6)", "is not allowed in HAVING"),
    ],
)  # fmt: skip
def test_a_grouped_semi_join_is_refused_where_a_group_could_mix_persons(engine, sql, says):
    with pytest.raises(GateError, match=says):
        engine.query("ann", {"sql": sql, "epsilon": 1.0})
