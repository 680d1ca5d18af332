"""Numbers an attacker can plant or ask for: NaN, ±inf, -0.0, 1e308, NULLs, many
rows at the bounds, extreme ε. Sums are exact fixed point (never a float SUM),
overflow is ruled out before running, released floats lie on the noise grid,
and no ε makes the noise give the exact value away.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import BadRequest, OverBudget, Refused
from dpmagic.gate.policy import load_policy
from dpmagic.gate.request import QueryRequest
from dpmagic.gate.sql.rewrite import rewrite

SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324, None]
# y in [-2.5, 2.5]: NaN compares above every number, so it counts as the upper bound.
SPECIAL_CLAMPED = [2.5, 2.5, -2.5, 0.0, 2.5, -2.5, 5e-324, None]
MANY = 300_000
BIG = 10**12

POLICY = f"""
[gate]
state_dir = "state"

[datasets.n]
database = "n.duckdb"
user_budget = {{ epsilon = 1e12 }}
notebook_budget = {{ epsilon = 1e12 }}

[datasets.n.tables.t.columns]
pid = {{ type = "int" }}
x = {{ type = "int", lower = -{BIG}, upper = {BIG} }}
y = {{ type = "float", lower = -2.5, upper = 2.5 }}

[datasets.n.tables.many.columns]
pid = {{ type = "int" }}
x = {{ type = "int", lower = 0, upper = {BIG} }}
y = {{ type = "float", lower = -2.5, upper = 2.5 }}
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    folder: Path = tmp_path_factory.mktemp("numbers")
    con = duckdb.connect(str(folder / "n.duckdb"))
    con.execute("CREATE TABLE t (pid BIGINT, x BIGINT, y DOUBLE)")
    con.executemany(
        "INSERT INTO t VALUES (?, ?, ?)",
        [(i, None if v is None else 2**62, v) for i, v in enumerate(SPECIAL)],
    )
    # Every row at a bound: the largest sums the bounds allow for this many rows.
    con.execute(
        f"CREATE TABLE many AS SELECT range AS pid, {BIG}::BIGINT AS x,"
        f" CASE WHEN range % 2 = 0 THEN 2.5 ELSE -2.5 END AS y FROM range({MANY})"
    )
    con.close()
    (folder / "policy.toml").write_text(POLICY)
    e = Engine(load_policy(folder / "policy.toml"))
    yield e
    e.close()


def _exact(engine: Engine, sql: str) -> dict[str, Fraction]:
    """Each measurement's exact value on the locked database, in released units."""
    ds = engine.policy.dataset("n")
    p = engine.analyse(ds, QueryRequest.from_body({"sql": sql}))
    rw = rewrite(p)
    (row,) = engine.databases["n"].run(rw.sql).rows
    out = {}
    for m, value in zip(p.measurements, row, strict=True):
        out[m.label] = Fraction(int(value or 0)) * Fraction(2) ** m.grid_exp
    return out


def test_special_floats_and_nulls_are_clamped_as_read(engine):
    exact = _exact(engine, "SELECT SUM(y), COUNT(y), SUM(x) FROM t")
    grid = engine.analyse(
        engine.policy.dataset("n"), QueryRequest.from_body({"sql": "SELECT SUM(y) FROM t"})
    ).measurements[0]
    step = Fraction(2) ** grid.grid_exp
    assert exact["SUM(y)"] == sum(
        round(Fraction(v) / step) * step for v in SPECIAL_CLAMPED if v is not None
    )
    assert exact["COUNT(y)"] == len(SPECIAL) - 1  # NULL is not counted, NaN is
    assert exact["SUM(x)"] == BIG * (len(SPECIAL) - 1)  # 2**62 clamped to the bound


def test_many_rows_at_the_bounds_sum_exactly(engine):
    exact = _exact(engine, "SELECT SUM(x), SUM(y), SUM(x + x) FROM many")
    assert exact["SUM(x)"] == MANY * BIG
    assert exact["SUM(x + x)"] == 2 * MANY * BIG  # past 2**63: summed in 128 bits
    assert exact["SUM(y)"] == 0  # 150,000 × 2.5 − 150,000 × 2.5, no rounding drift


def test_no_float_sum_reaches_duckdb(engine):
    ds = engine.policy.dataset("n")
    for sql in (
        "SELECT SUM(y), AVG(y / 3), SUM(x * 0.5) FROM t",
        "SELECT SUM(CASE WHEN y > 0 THEN y ELSE -y END) FROM many",
    ):
        generated = rewrite(engine.analyse(ds, QueryRequest.from_body({"sql": sql}))).sql
        tree = sqlglot.parse_one(generated, dialect="duckdb")
        sums = [s.this for s in tree.find_all(exp.Sum)]
        sums += [
            a.expressions[0]
            for a in tree.find_all(exp.Anonymous)
            if a.name.lower() == "sum_no_overflow"
        ]
        assert sums
        for node in sums:
            assert isinstance(node, exp.Cast)
            integers = (exp.DataType.Type.BIGINT, exp.DataType.Type.INT128)
            assert node.to.this in integers, node.sql()


def test_duckdb_sums_bigints_exactly_past_64_bits():
    """The rewrite sums BIGINT grid values when each fits in 64 bits: DuckDB adds them
    in 128 bits, so their sum may pass 2**63 and stay exact."""
    con = duckdb.connect()
    (total, kind) = con.execute(
        f"SELECT SUM(x), typeof(SUM(x)) FROM (SELECT {2**62 + 1}::BIGINT AS x FROM range(1000))"
    ).fetchone()
    assert (total, kind) == (1000 * (2**62 + 1), "HUGEINT")


def test_released_floats_lie_on_the_noise_grid(engine):
    ds = engine.policy.dataset("n")
    sql = "SELECT SUM(y) AS s, AVG(y) AS a FROM t"
    p = engine.analyse(ds, QueryRequest.from_body({"sql": sql}))
    step = Fraction(2) ** next(m for m in p.measurements if m.kind == "sum").grid_exp
    for _ in range(20):
        reply = engine.query("numbers", {"sql": sql, "fresh": True})
        s, a = reply["rows"][0]
        assert (Fraction(s) / step).denominator == 1
        assert -2.5 <= a <= 2.5


def test_overflow_is_refused_before_anything_runs(engine):
    before = engine.ledger.spent("numbers-overflow", "n").epsilon
    with pytest.raises(Refused, match="overflow"):
        engine.query("numbers-overflow", {"sql": "SELECT SUM(x * x) FROM t"})
    assert engine.ledger.spent("numbers-overflow", "n").epsilon == before == 0.0


def test_noise_that_could_saturate_is_refused_not_released(engine):
    """OpenDP's integer noise saturates at ±2**63; exact + saturated noise would be the
    exact value shifted by a known constant. Such scales are refused before the charge."""
    with pytest.raises(Refused, match="too small"):
        engine.query("numbers-tiny", {"sql": "SELECT SUM(x) FROM t", "epsilon": 1e-5})
    assert engine.ledger.spent("numbers-tiny", "n").epsilon == 0.0


@pytest.mark.parametrize("epsilon", [1e-12, 1e-9, 1e-3, 1.0, 1e3, 1e8, 1e300])
@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM t", "SELECT SUM(y), AVG(y) FROM t"])
def test_any_epsilon_is_answered_or_refused_cleanly(engine, sql, epsilon):
    user = f"numbers-{epsilon}"
    try:
        reply = engine.query(user, {"sql": sql, "epsilon": epsilon})
    except (Refused, OverBudget):
        assert engine.ledger.spent(user, "n").epsilon == 0.0
        return
    assert all(isinstance(v, int | float) and math.isfinite(v) for v in reply["rows"][0])
    for column in reply["accuracy"]["columns"]:
        assert all(math.isfinite(x) for pair in column["intervals"] for x in pair)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1, 5e-324, True, "1"])
def test_non_finite_or_non_positive_epsilon_is_a_bad_request(engine, value):
    with pytest.raises(BadRequest):
        engine.query("numbers-bad", {"sql": "SELECT COUNT(*) FROM t", "epsilon": value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_parameters_are_refused(engine, value):
    with pytest.raises(Refused, match="finite"):
        engine.query(
            "numbers-bad", {"sql": "SELECT COUNT(*) FROM t WHERE y > $v", "params": {"v": value}}
        )
