"""A centred sum and its count in one column (``rewrite.Fused``): the gate takes them
apart into exactly what the two columns would have held, on real DuckDB, for any
rows the grammar's bare-column averages can meet; it fuses only where that is
sure (one table read once, terms that fit a BIGINT beside a count of fewer than
``plan.MAX_ROWS`` rows, an engine that sums them into 128 bits); and it decides so
from the plan alone, never from the data's size."""

from __future__ import annotations

from dataclasses import replace

import duckdb
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.engine import QueryRequest
from dpmagic.gate.engines import interface
from dpmagic.gate.engines.spark.dialect import SPARK
from dpmagic.gate.policy import PolicyError
from dpmagic.gate.sql import rewrite as rewrite_module
from dpmagic.gate.sql.noise import exact_vectors
from dpmagic.gate.sql.plan_types import MAX_ROWS
from dpmagic.gate.sql.rewrite import FUSED_BITS, _single_source, rewrite
from tests.gate_helpers import dataset, load_table, make_plan, run_rewritten, running_engine

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": -7, "upper": 5},
    "y": {"type": "float", "lower": -2.5, "upper": 3.0},
}
FUSED = [
    "SELECT g, AVG(x) FROM t GROUP BY g",
    "SELECT g, AVG(y) FROM t GROUP BY g",
    "SELECT AVG(x), AVG(y), COUNT(*) FROM t WHERE g <> 1",
    "SELECT g, AVG(y), COUNT(y), SUM(y) FROM t GROUP BY g HAVING COUNT(*) > 1",
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=rows, sql=st.sampled_from(FUSED), max_rows=st.integers(1, 3), seed=st.integers(0, 99))
def test_fused_sums_and_counts_equal_the_two_columns(data, sql, max_rows, seed):
    p = make_plan(sql, dataset(COLUMNS, max_partitions=2, max_rows=max_rows))
    con = duckdb.connect()
    load_table(con, "t", ["pid", "g", "x", "y"], data)
    fused, _ = run_rewritten(p, con, seed)
    assert fused.fused, "a bare-column average over one table is fused"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rewrite_module, "FUSED_BITS", 63)  # no count fits: nothing fused
        apart = rewrite(p, seed=seed)
    assert apart.fused == ()
    assert _vectors(p, fused, con) == _vectors(p, apart, con)


def test_too_few_bits_give_other_vectors(monkeypatch):
    """The comparison above catches a fusion whose count overflows its bits: with
    1 bit for counts, groups of two rows or more decode wrong."""
    p = make_plan(FUSED[0], dataset(COLUMNS, max_partitions=2, max_rows=3))
    con = duckdb.connect()
    load_table(con, "t", ["pid", "g", "x", "y"], [(u, 0, 3, 1.0) for u in range(1, 5)])
    right, _ = run_rewritten(p, con, seed=1)  # prepares the tables
    monkeypatch.setattr(rewrite_module, "FUSED_BITS", 1)
    wrong = rewrite(p, seed=1)
    assert [f.bits for f in wrong.fused] == [1]
    assert _vectors(p, wrong, con) != _vectors(p, right, con)


def test_the_bits_hold_any_table_the_gate_serves_and_the_sql_is_one_aggregate():
    assert 2**FUSED_BITS >= MAX_ROWS > 2 ** (FUSED_BITS - 1)
    p = make_plan(FUSED[1], dataset(COLUMNS))
    rw = rewrite(p, seed=1)
    (f,) = rw.fused
    assert f.bits == FUSED_BITS
    assert f.count not in rw.measurements and f.sum in rw.measurements
    assert f"* {2**FUSED_BITS} + 1" in rw.sql and "COUNT(" not in rw.sql


@pytest.mark.parametrize(
    ("sql", "columns", "tables"),
    [
        # A join reads rows of the unit's table once per match.
        ("SELECT AVG(a.x) FROM t AS a JOIN t AS b ON a.pid = b.pid", COLUMNS, {}),
        # A second table in a semi-join: two tables read.
        (
            "SELECT AVG(x) FROM t WHERE pid IN (SELECT pid FROM u WHERE z > 0)",
            COLUMNS,
            {"u": {"columns": {"pid": {"type": "int"}, "z": {"type": "int"}}}},
        ),
        # A value not of the column as stored: its cast may be NULL where it is not;
        # so are a variance's centred squares.
        ("SELECT AVG(x + 1) FROM t", COLUMNS, {}),
        ("SELECT g, VAR_SAMP(y), STDDEV_POP(x) FROM t GROUP BY g", COLUMNS, {}),
        # Terms past 64 bits: 2^58 grid units beside a count's 2^40.
        ("SELECT AVG(x) FROM t", {**COLUMNS, "x": {"type": "int", "lower": 0, "upper": 2**58}}, {}),
    ],
)
def test_no_fusion_where_it_might_not_be_exact(sql, columns, tables):
    p = make_plan(sql, dataset(columns, more_tables=tables), epsilon=1e6)
    assert rewrite(p, seed=1).fused == ()


def test_no_fusion_on_spark():
    p = make_plan(FUSED[0], dataset(COLUMNS))
    assert rewrite(p, seed=1, dialect=SPARK).fused == ()
    assert rewrite(p, seed=1).fused != ()


@pytest.mark.parametrize(
    ("sql", "source"),
    [
        ("WITH k AS (SELECT x FROM t WHERE y > 0) SELECT SUM(x) FROM k", "t"),
        ("SELECT SUM(x) FROM (SELECT x FROM T) AS s WHERE x IN (SELECT 1)", "t"),
        ("SELECT SUM(x) FROM t, u", None),
        ("SELECT SUM(x) FROM t JOIN t AS b ON t.pid = b.pid", None),
        ("SELECT SUM(x) FROM (SELECT x FROM t UNION ALL SELECT x FROM t) AS s", None),
        ("SELECT SUM(v) FROM (SELECT UNNEST([x, x]) AS v FROM t) AS s", None),
        ("SELECT SUM(v) FROM range(10) AS r(v)", None),
        ("SELECT SUM(x) FROM t, LATERAL (SELECT 1) AS l", None),
        ("SELECT SUM(v) FROM (UNPIVOT t ON x, y INTO NAME n VALUE v) AS s", None),
        ("WITH t AS (SELECT 1 AS x) SELECT SUM(x) FROM t", None),
    ],
)
def test_the_single_source_rule(sql, source):
    assert _single_source(sqlglot.parse_one(sql, read="duckdb")) == source


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


def _fused(engine) -> tuple:
    request = QueryRequest.from_body({"sql": AVERAGE})
    return engine.analysis("u", engine._dataset("d"), request).analysed.rewritten.fused


def test_the_gate_fuses_and_answers(tmp_path):
    with running_engine(tmp_path, POLICY, _visits(300)) as engine:
        (f,) = _fused(engine)
        assert f.bits == FUSED_BITS
        reply = engine.query("alice", {"sql": AVERAGE, "epsilon": 10.0})
        assert [r[0] for r in reply["rows"]] == [0, 1]
        assert all(abs(r[1] - 4.5) < 2.0 for r in reply["rows"])  # y averages 4.5 in each


def test_fusing_does_not_depend_on_the_data(tmp_path):
    """Neighbours on either side of a power of two (255 and 256 rows) are fused alike:
    a choice made from the table's size, as the first version of ``Fused`` made it
    (bits from the row count), would differ here and show in the query's time."""
    fused = []
    for n in (255, 256):
        with running_engine(tmp_path / str(n), POLICY, _visits(n)) as engine:
            fused.append(_fused(engine))
    assert fused[0] == fused[1] != ()


def test_a_table_of_max_rows_is_not_served(tmp_path, monkeypatch):
    monkeypatch.setattr(interface, "MAX_ROWS", 256)
    with running_engine(tmp_path / "below", POLICY, _visits(255)) as engine:
        assert _fused(engine)
    with (
        pytest.raises(PolicyError, match="table 't' has 256 rows or more"),
        running_engine(tmp_path / "at", POLICY, _visits(256)),
    ):
        pass


def test_replacing_bits_is_what_the_decoder_reads():
    """The decoder takes the bits from ``Fused``, not from anywhere else."""
    p = make_plan(FUSED[0], dataset(COLUMNS))
    rw = rewrite(p, seed=1)
    (f,) = rw.fused
    packed = (3 << f.bits) + 2  # S = 3, N = 2 in partition g = 0
    units, _ = exact_vectors(p, rw, [(0, packed)], p.partitions)
    assert units[f.count] == [2, 0, 0]
    other = replace(rw, fused=(replace(f, bits=f.bits + 1),))
    assert exact_vectors(p, other, [(0, packed)], p.partitions)[0][f.count] != [2, 0, 0]


@pytest.mark.parametrize(("upper", "fused"), [(2**23 - 1, True), (2**23, False), (2**58, False)])
def test_the_bits_bound_decides_for_wide_values(upper, fused):
    """Summed as stored (the centring is taken off from the count), values reach
    ``upper`` grid units: ``2^23 - 1`` and a count's 40 bits fit 63 bits, ``2^23``
    does not."""
    wide = {**COLUMNS, "x": {"type": "int", "lower": 0, "upper": upper}}
    p = make_plan("SELECT AVG(x) FROM t", dataset(wide), epsilon=1e6)
    assert bool(rewrite(p, seed=1).fused) == fused
