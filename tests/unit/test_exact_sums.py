"""Exact sums (``Dialect.exact_sum``): summed in 64 bits (DuckDB's ``sum_no_overflow``,
which does not check) only where the plan proves no partial sum can reach ``2^63``,
in 128 bits otherwise; the two give the same vectors on real DuckDB for any rows the
grammar's sums and averages can meet; the choice comes from the plan alone, never
the data's size; and a rule that let a 64-bit sum overflow is caught."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.engines import dialect as dialects
from dpmagic.gate.engines import interface
from dpmagic.gate.engines.dialect import fits_64_bits
from dpmagic.gate.engines.interface import MAX_ROWS
from dpmagic.gate.engines.spark.dialect import SPARK
from dpmagic.gate.policy import PolicyError
from dpmagic.gate.request import QueryRequest
from dpmagic.gate.sql import plan_types
from dpmagic.gate.sql.noise import exact_vectors
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import dataset, load_table, make_plan, run_rewritten, running_engine

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": -7, "upper": 5},
    "y": {"type": "float", "lower": -2.5, "upper": 3.0},
}
SUMS = [
    "SELECT g, AVG(x) FROM t GROUP BY g",
    "SELECT g, AVG(y) FROM t GROUP BY g",
    "SELECT AVG(x), AVG(y), COUNT(*) FROM t WHERE g <> 1",
    "SELECT g, AVG(y), COUNT(y), SUM(y) FROM t GROUP BY g HAVING COUNT(*) > 1",
    "SELECT g, SUM(x * 2 - y), VAR_POP(x) FROM t GROUP BY g",
    "SELECT SUM(a.x) FROM t AS a JOIN t AS b ON a.pid = b.pid",
]
values = st.one_of(st.none(), st.integers(-9, 9))
floats = st.one_of(st.none(), st.floats(-4.0, 4.0, allow_nan=False))
rows = st.lists(
    st.tuples(st.integers(1, 6), st.integers(0, 3), values, floats), min_size=0, max_size=30
)


def _vectors(p, rw, con) -> dict[str, list]:
    """The exact vectors of ``rw`` run on the prepared tables ``run_rewritten`` made."""
    con.execute("SET schema = 'prepared'")
    try:
        result = con.execute(rw.sql).fetchall()
    finally:
        con.execute("SET schema = 'main'")
    units, histograms = exact_vectors(p, rw, result, p.partitions)
    return {**units, **histograms}


@pytest.mark.search
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=rows, sql=st.sampled_from(SUMS), max_rows=st.integers(1, 3), seed=st.integers(0, 99))
def test_64_bit_sums_equal_128_bit_sums(data, sql, max_rows, seed):
    p = make_plan(sql, dataset(COLUMNS, max_partitions=2, max_rows=max_rows))
    con = duckdb.connect()
    load_table(con, "t", ["pid", "g", "x", "y"], data)
    short, _ = run_rewritten(p, con, seed)
    assert "SUM_NO_OVERFLOW" in short.sql
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dialects, "fits_64_bits", lambda widest, rows: False)
        wide = rewrite(p, seed=seed)
    assert "SUM_NO_OVERFLOW" not in wide.sql and "SUM(" in wide.sql
    assert _vectors(p, short, con) == _vectors(p, wide, con)


WIDE = {**COLUMNS, "x": {"type": "int", "lower": 0, "upper": 2**61}}
NEAR = [(u, 0, 2**61, None) for u in range(1, 5)]  # four rows: 4·2^61 = 2^63


def _wide_sum(monkeypatch, rule) -> list[int]:
    """``SUM(x)`` of four units at ``2^61`` each (``2^63``, one past a BIGINT), with
    tables capped below 5 rows (a partition may add 4 rows, which do not fit) and the
    64-bit rule ``rule``."""
    monkeypatch.setattr(plan_types, "MAX_ROWS", 5)
    monkeypatch.setattr(dialects, "fits_64_bits", rule)
    p = make_plan("SELECT SUM(x) AS s FROM t", dataset(WIDE, max_rows=1), epsilon=1e6)
    con = duckdb.connect()
    load_table(con, "t", ["pid", "g", "x", "y"], NEAR)
    _, exact = run_rewritten(p, con, seed=1)
    return [int(v) for (v,) in exact.rows]


def test_a_sum_that_could_pass_63_bits_is_summed_in_128(monkeypatch):
    assert _wide_sum(monkeypatch, fits_64_bits) == [2**63]


@pytest.mark.parametrize(
    "broken",
    [
        lambda widest, rows: widest < 2**63,  # forgets how many rows add up
        lambda widest, rows: widest * (rows - 2) < 2**63,  # counts too few of them
    ],
)
def test_a_rule_that_lets_64_bits_overflow_is_caught(monkeypatch, broken):
    assert _wide_sum(monkeypatch, broken) != [2**63]


@pytest.mark.parametrize(
    ("widest", "rows", "fits"),
    [
        (2**23 - 1, MAX_ROWS, True),
        (2**23, MAX_ROWS, False),
        (2**23 - 1.5, MAX_ROWS, True),
        (2**23 - 0.5, MAX_ROWS, False),  # a fraction counts as the next integer
        (2**62, 1, True),
        (2**63, 1, False),
    ],
)
def test_the_64_bit_rule_is_exact_arithmetic(widest, rows, fits):
    assert fits_64_bits(widest, rows) is fits


@pytest.mark.parametrize(("upper", "short"), [(2**23 - 1, True), (2**23, False), (2**58, False)])
def test_the_bound_decides_for_wide_values(upper, short):
    """A sum over one table adds fewer than ``MAX_ROWS = 2^40`` rows: values up to
    ``2^23 - 1`` fit 63 bits, ``2^23`` do not."""
    wide = {**COLUMNS, "x": {"type": "int", "lower": 0, "upper": upper}}
    p = make_plan("SELECT SUM(x) FROM t", dataset(wide), epsilon=1e6)
    assert ("SUM_NO_OVERFLOW" in rewrite(p, seed=1).sql) is short


def test_a_float_sum_leaves_room_for_its_rounding():
    """A value on the grid may round up by one: ``grid_sum`` asks for a bound one
    wider than the clamp's (here a clamp of exactly ``2^23 - 1`` grid units)."""
    seen = []
    original = dialects.Dialect.exact_sum

    def noted(self, value, widest, rows):
        seen.append(widest)
        return original(self, value, widest, rows)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dialects.Dialect, "exact_sum", noted)
        p = make_plan("SELECT SUM(y) FROM t", dataset(COLUMNS), epsilon=1e6)
        rewrite(p, seed=1)
    grid = p.measurements[0]
    assert seen == [max(abs(grid.bounds.lo), abs(grid.bounds.hi)) * 2.0**-grid.grid_exp + 1]


def test_spark_sums_in_its_own_way():
    p = make_plan(SUMS[0], dataset(COLUMNS))
    assert "SUM_NO_OVERFLOW" not in rewrite(p, seed=1, dialect=SPARK).sql


POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 2
user_budget = { epsilon = 10.0 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "int", public_values = [0, 1] }
y = { type = "float", lower = 0, upper = 10 }
"""
AVERAGE = "SELECT g, AVG(y) AS a FROM t GROUP BY g"


def _visits(n: int) -> dict:
    return {"t": ("pid,g,y", [(i // 2, i % 2, (i * 7) % 10) for i in range(n)])}


def _sql(engine) -> str:
    request = QueryRequest.from_body({"sql": AVERAGE})
    return engine.analysis("u", engine._dataset("d"), request).analysed.rewritten.sql


def test_the_gate_sums_in_64_bits_and_answers(tmp_path):
    with running_engine(tmp_path, POLICY, _visits(300)) as engine:
        assert "SUM_NO_OVERFLOW" in _sql(engine)
        reply = engine.query("alice", {"sql": AVERAGE, "epsilon": 10.0})
        assert [r[0] for r in reply["rows"]] == [0, 1]
        assert all(abs(r[1] - 4.5) < 2.0 for r in reply["rows"])  # y averages 4.5 in each


def test_the_sql_does_not_depend_on_the_data(tmp_path):
    """Neighbours on either side of a power of two (255 and 256 rows) get the same
    SQL: a choice made from the table's size would differ here and show in the
    query's time."""
    texts = []
    for n in (255, 256):
        with running_engine(tmp_path / str(n), POLICY, _visits(n)) as engine:
            texts.append(_sql(engine))
    assert texts[0] == texts[1] and "SUM_NO_OVERFLOW" in texts[0]


def test_a_table_of_max_rows_is_not_served(tmp_path, monkeypatch):
    monkeypatch.setattr(interface, "MAX_ROWS", 256)
    with running_engine(tmp_path / "below", POLICY, _visits(255)) as engine:
        assert _sql(engine)
    with (
        pytest.raises(PolicyError, match="table 't' has 256 rows or more"),
        running_engine(tmp_path / "at", POLICY, _visits(256)),
    ):
        pass
