"""The generated SQL on real DuckDB: clamping, NULLs, exact sums, the locked
connection, and post-processing of noisy values."""

from __future__ import annotations

import os
import stat
from fractions import Fraction

import duckdb
import pytest

from dpmagic.gate.engines.duckdb.database import Database, UnsafeSQL
from dpmagic.gate.engines.interface import ExactResult, OutOfResources
from dpmagic.gate.policy import GateConfig, parse_policy
from dpmagic.gate.sql.noise import Noisy, noise
from dpmagic.gate.sql.release import release
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": -3, "upper": 5},
    "y": {"type": "float", "lower": 0.0, "upper": 2.5},
}
ORDER = ["pid", "g", "x", "y"]
ROW_LEVEL = dataset(COLUMNS, unit=None)


def run(sql: str, rows: list[tuple], ds=ROW_LEVEL) -> dict[str, list[int]]:
    return run_seeded(sql, rows, ds, seed=1)


def run_seeded(sql: str, rows: list[tuple], ds, seed: int) -> dict[str, list[int]]:
    p = make_plan(sql, ds)
    con = duckdb.connect()
    load_table(con, "t", ORDER, rows)
    vectors = exact_vectors(p, con, seed=seed)
    return {m.label: vectors[m.name] for m in p.measurements}


def test_values_are_clamped_after_the_expression():
    # x is clamped to [-3, 5] as read; x * 10 lies in [-30, 50]; a sum of x*10 - 100
    # of a row with x = 99 counts as 5*10 - 100 = -50, not as 99*10 - 100.
    out = run("SELECT SUM(x * 10 - 100) FROM t", [(1, 0, 99, 1.0), (2, 0, -99, 1.0)])
    assert out["SUM(x * 10 - 100)"] == [(5 * 10 - 100) + (-3 * 10 - 100)]


def test_nulls_are_never_clamped_into_a_bound():
    rows = [(1, 0, None, None), (2, 0, 4, 2.0), (3, 1, None, 1.0)]
    out = run("SELECT g, SUM(x), COUNT(x), COUNT(*), SUM(y) FROM t GROUP BY g", rows)
    assert out["SUM(x)"] == [4, 0, 0]
    assert out["COUNT(x)"] == [1, 0, 0]
    assert out["COUNT(*)"] == [2, 1, 0]


def test_fixed_point_sums_are_exact():
    p = make_plan("SELECT SUM(y) FROM t", ROW_LEVEL)
    (m,) = p.measurements
    rows = [(i, 0, 0, 0.1) for i in range(3000)] + [(9999, 0, 0, 2.5)]
    con = duckdb.connect()
    load_table(con, "t", ORDER, rows)
    units = exact_vectors(p, con, seed=3)[m.name][0]
    step = Fraction(2) ** m.grid_exp
    expected = sum(round(Fraction(r[3]) / step) for r in rows)
    assert units == expected
    # A float SUM would differ in the last bits; ours is an integer count of grid steps.
    assert abs(units * step - Fraction(3000 * 0.1 + 2.5)) <= len(rows) * step


def test_narrowed_bounds_do_not_change_in_bound_answers():
    rows = [(i, i % 3, (i % 9) - 3, (i % 11) * 0.25) for i in range(60)]
    sql = "SELECT SUM(CASE WHEN y > 1 THEN 1 ELSE y END), SUM(LEAST(x, 2)) FROM t"
    out = run(sql, rows)
    step = Fraction(2) ** make_plan(sql, ROW_LEVEL).measurements[0].grid_exp
    assert out["SUM(CASE WHEN y > 1 THEN 1 ELSE y END)"] == [
        sum(round(Fraction(min(r[3], 1.0)) / step) for r in rows)
    ]
    assert out["SUM(LEAST(x, 2))"] == [sum(min(r[2], 2) for r in rows)]


@pytest.mark.parametrize(
    ("value", "counted"),
    [(float("nan"), 2.5), (float("inf"), 2.5), (float("-inf"), 0.0), (-0.0, 0.0), (1e308, 2.5)],
)
def test_special_floats_are_clamped(value, counted):
    p = make_plan("SELECT SUM(y) FROM t", ROW_LEVEL)
    (m,) = p.measurements
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 0, value)])
    units = exact_vectors(p, con, seed=3)[m.name][0]
    assert units * 2.0**m.grid_exp == pytest.approx(counted)


def kept_per_group(seeds: range) -> list[int]:
    """A unit with 30 rows keeps 2·3 of them in a grouped query and 3 in an ungrouped
    one under each load seed: the rows kept of each group, summed over the seeds."""
    ds = dataset(COLUMNS, max_partitions=2, max_rows=3)
    rows = [(1, g, 1, 0.0) for g in (0, 1, 2) for _ in range(10)] + [(2, 0, 1, 0.0)]
    kept = [0, 0, 0]
    for seed in seeds:
        counts = run_seeded("SELECT g, COUNT(*) FROM t GROUP BY g", rows, ds, seed)["COUNT(*)"]
        assert sum(counts) == 6 + 1
        kept = [k + c for k, c in zip(kept, counts, strict=True)]
        assert run_seeded("SELECT COUNT(*) FROM t", rows, ds, seed)["COUNT(*)"] == [3 + 1]
    return kept


def test_user_level_bounding_keeps_k_times_m_rows_per_unit():
    """The bound under a few seeds; the search below checks which rows are kept."""
    kept_per_group(range(3))


@pytest.mark.search
def test_user_level_bounding_chooses_the_kept_rows_uniformly():
    """Which rows are kept changes with the load seed, copies of one row included."""
    kept = kept_per_group(range(30))
    # A uniform choice keeps 2 rows of each group per seed: 60 in 30 seeds, sd about 6,
    # so 30 or fewer has probability below 1e-6; a choice stuck on one group fails.
    assert all(k > 30 for k in kept)


def test_the_unit_is_its_declared_value_not_its_spelling():
    """'1', '01' and ' 1' are one unit of a declared int: one bound for all three."""
    ds = dataset({**COLUMNS, "pid": {"type": "int"}}, max_partitions=1, max_rows=2)
    p = make_plan("SELECT COUNT(*) FROM t", ds)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pid VARCHAR, g BIGINT, x BIGINT, y DOUBLE)")
    con.executemany(
        "INSERT INTO t VALUES (?, 0, 1, 0.0)", [["1"], ["01"], [" 1"], ["1"], ["x"], [None]]
    )
    assert exact_vectors(p, con, seed=4)[p.measurements[0].name] == [2]


def test_rows_without_a_unit_are_dropped():
    """As the table is prepared: the generated SQL reads a stored table's unit without
    testing it for NULL (``rewrite._row_filters``), so this count of 1 rests on the
    preparation alone; one that kept the rows would count 3."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=5)
    out = run("SELECT COUNT(*) FROM t", [(None, 0, 1, 0.0), (None, 1, 1, 0.0), (1, 0, 1, 0.0)], ds)
    assert out["COUNT(*)"] == [1]


def test_user_text_never_reaches_duckdb():
    p = make_plan("select   Count(*)  from T where x > 1 -- a comment", ROW_LEVEL)
    sql = rewrite(p).sql
    assert "comment" not in sql and "Count(*)" not in sql
    assert "NULLIF" in make_rewritten("SELECT SUM(y / x) FROM t")


def make_rewritten(sql: str) -> str:
    return rewrite(make_plan(sql, ROW_LEVEL)).sql


# -- the locked database ---------------------------------------------------------


@pytest.fixture
def locked(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("pid,g,x,y\n1,0,1,0.5\n2,1,2,1.5\n")
    raw = {
        "gate": {"state_dir": "state", "query_timeout_s": 0.5},
        "datasets": {
            "d": {
                "sources": {"t": "t.csv"},
                "user_budget": {"epsilon": 1.0},
                "tables": {"t": {"columns": COLUMNS}},
            }
        },
    }
    policy = parse_policy(raw, tmp_path / "policy.toml")
    db = Database(policy.dataset("d"), policy.gate)
    yield db, policy.gate
    db.close()


def test_materialised_data_is_private_to_the_gate(locked):
    _, gate = locked
    assert stat.S_IMODE(os.stat(gate.state_dir).st_mode) == 0o700
    (prepared,) = gate.state_dir.glob("d.*.duckdb")
    assert stat.S_IMODE(os.stat(prepared).st_mode) == 0o600


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SET threads = 1",
        "ATTACH 'elsewhere.duckdb' AS x",
        "COPY t TO 'out.csv'",
        "INSTALL httpfs",
        "CREATE TABLE u AS SELECT 1",
        "SELECT * FROM 'policy.toml'",
    ],
)
def test_locked_connection_refuses_escape_hatches(locked, sql):
    db, _ = locked
    with pytest.raises((duckdb.Error, UnsafeSQL)):
        db.run(sql)


def test_state_does_not_survive_between_queries(locked):
    db, _ = locked
    with pytest.raises(UnsafeSQL):
        db.run("CREATE TEMP TABLE scratch AS SELECT 1 AS a")
    # Even one made on a connection of the same database is gone for the next query.
    other = db._db.cursor()
    other.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS a")
    other.close()
    with pytest.raises((duckdb.CatalogException, UnsafeSQL)):
        db.run("SELECT a FROM scratch")


def test_long_queries_are_interrupted(locked):
    db, _ = locked
    with pytest.raises(OutOfResources):
        db.run(
            "SELECT COUNT(*) FROM range(100000000) a, range(100000) b WHERE a.range % 7 = b.range"
        )


def test_a_run_fetched_in_columns_is_guarded_and_interrupted_alike(locked):
    """The columnar fetch (``batches``) runs under the same guard and timeout as rows."""
    db, _ = locked
    with pytest.raises(OutOfResources):
        db.run(
            "SELECT COUNT(*) FROM range(100000000) a, range(100000) b WHERE a.range % 7 = b.range",
            batches=lambda batch: batch,
        )
    with pytest.raises((duckdb.Error, UnsafeSQL)):
        db.run("SELECT * FROM read_csv('/etc/passwd')", batches=lambda batch: batch)
    kept = db.run("SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY g", batches=lambda b: b)
    assert kept.rows == [] and kept.table.to_pylist() == [
        {"g": 0, "count_star()": 1},
        {"g": 1, "count_star()": 1},
    ]


def test_gate_config_defaults_are_sane():
    assert GateConfig(listen="unix:x", state_dir=None).query_timeout_s > 0  # type: ignore[arg-type]


# -- release: post-processing of noisy values ------------------------------------


def _released(sql: str, values: dict[str, list], ds=ROW_LEVEL):
    p = make_plan(sql, ds)
    by_label = {m.label: m.name for m in p.measurements}
    noisy = Noisy(
        plan=p, values={by_label[k]: v for k, v in values.items()}, partitions=p.partitions
    )
    return release(noisy)


def test_having_order_limit_run_on_noisy_values():
    r = _released(
        "SELECT g, COUNT(*) AS n FROM t GROUP BY g HAVING COUNT(*) > 10 ORDER BY n DESC LIMIT 1",
        {"COUNT(*)": [12, 50, 3]},
    )
    assert r.columns == ["g", "n"]
    assert r.rows == [[1, 50]]
    (key, count) = r.accuracy["columns"]
    assert key is None
    lo, hi = count["intervals"][0]
    assert lo < 50 < hi


def test_counts_are_floored_at_zero_and_averages_clamped():
    r = _released(
        "SELECT g, COUNT(*), AVG(y) FROM t GROUP BY g",
        {
            "COUNT(*)": [-4, 7, 2],
            "SUM(y) centred on 1.25": [98.75, -8.0, 0.75],
            "COUNT(y)": [1, 4, 0],
        },
    )
    assert [row[1] for row in r.rows] == [0, 7, 2]
    # The centre plus the centred sum over the count: 1.25 + 98.75/1 is clamped to the
    # upper bound 2.5; 1.25 - 8/4 to 0; 1.25 + 0.75/max(0, 1) = 2.
    assert [row[2] for row in r.rows] == [2.5, 0.0, 2.0]
    avg_intervals = r.accuracy["columns"][2]["intervals"]
    assert all(0.0 <= lo <= hi <= 2.5 for lo, hi in avg_intervals)


def test_post_processing_cannot_fail_on_noisy_zeros():
    r = _released(
        "SELECT g, SUM(x) % COUNT(*) AS m, SUM(x) / COUNT(*) AS q FROM t GROUP BY g",
        {"SUM(x)": [3, 4, 5], "COUNT(*)": [0, 2, -1]},
    )
    assert [row[1:] for row in r.rows] == [[None, None], [0, 2.0], [None, None]]


def test_arithmetic_over_aggregates_carries_an_interval():
    r = _released(
        "SELECT ROUND(SUM(x) / COUNT(*), 1) AS mean FROM t",
        {"SUM(x)": [30], "COUNT(*)": [10]},
    )
    assert r.rows == [[3.0]]
    col = r.accuracy["columns"][0]
    assert col["mechanism"] == "post-processing"
    lo, hi = col["intervals"][0]
    assert lo <= 3.0 <= hi


def test_variances_from_exact_parts_equal_duckdbs():
    """Fed the exact count, centred sum and centred sum of squares (no noise), the
    release formulas give DuckDB's own variances and standard deviations."""
    p = make_plan(
        "SELECT g, VAR_POP(x), VAR_SAMP(x), STDDEV_POP(y), STDDEV_SAMP(y) FROM t GROUP BY g",
        dataset(COLUMNS, max_partitions=3, max_rows=50),
    )
    rows = [(i, i % 3, (i * 7) % 9 - 3, (i % 6) / 2.4) for i in range(40)]
    con = duckdb.connect()
    load_table(con, "t", ORDER, rows)
    exact = exact_vectors(p, con, seed=1)
    values = {m.name: [v * m.noise.granularity for v in exact[m.name]] for m in p.measurements}
    released = release(Noisy(plan=p, values=values, partitions=p.partitions))
    truth = con.execute(
        "SELECT g, var_pop(x), var_samp(x), stddev_pop(y), stddev_samp(y) FROM t "
        "GROUP BY g ORDER BY g"
    ).fetchall()
    for got, want in zip(released.rows, truth, strict=True):
        assert got[0] == want[0]
        # Float values are summed on a grid far finer than the noise, not exactly.
        assert got[1:3] == pytest.approx(list(want[1:3]), rel=1e-9)
        assert got[3:] == pytest.approx(list(want[3:]), rel=1e-4)


def test_released_quantiles_lie_within_the_declared_bounds():
    p = make_plan("SELECT g, MIN(x), MEDIAN(y), MAX(x) FROM t GROUP BY g", ROW_LEVEL, epsilon=0.1)
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(i, i % 3, 99 * (-1) ** i, 1e9) for i in range(30)])
    rw = rewrite(p, seed=3)
    released = release(noise(p, rw, ExactResult(con.execute(rw.sql).fetchall())))
    for _, low, middle, high in released.rows:
        assert -3 <= low <= 5 and -3 <= high <= 5 and 0.0 <= middle <= 2.5
    assert [c["mechanism"] for c in released.accuracy["columns"][1:]] == ["exponential"] * 3


@pytest.mark.parametrize(
    ("sql", "values"),
    [
        ("SELECT g, COUNT(*) AS n FROM t GROUP BY g", {"COUNT(*)": [-4, 7, 2**40]}),
        (
            "SELECT COUNT(*), SUM(y), SUM(x) FROM t",
            {"COUNT(*)": [3], "SUM(y)": [-0.5], "SUM(x)": [-7]},
        ),
        (
            "SELECT x > 0 AS pos, g, SUM(y) FROM t GROUP BY pos, g",
            {"SUM(y)": [float(i) - 2.25 for i in range(6)]},
        ),
        (
            "SELECT CASE WHEN x < 0 THEN 'neg' ELSE 'pos' END AS sign, COUNT(x) FROM t "
            "GROUP BY sign",
            {"COUNT(x)": [0, -1]},
        ),
        ("SELECT g, COUNT(*) - 1 AS less FROM t GROUP BY g", {"COUNT(*)": [0, 1, 2]}),
        ("SELECT g, SUM(y) FROM t GROUP BY g", {"SUM(y)": [float("nan"), 1.0, 2.0]}),
    ],
)
def test_releases_without_duckdb_equal_what_it_returns(monkeypatch, sql, values):
    """Bare keys and aggregates are released without the post-processing database
    (arithmetic and NaN still go through it); the rows, their values and their types
    are what DuckDB returns for the same table."""
    direct = _released(sql, values)
    monkeypatch.setattr("dpmagic.gate.sql.release.direct", lambda table, exprs: None)
    through_duckdb = _released(sql, values)
    assert direct == through_duckdb
    assert [[type(v) for v in row] for row in direct.rows] == [
        [type(v) for v in row] for row in through_duckdb.rows
    ]
