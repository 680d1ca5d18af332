"""Gaussian noise for the zCDP accountant: its scale (statistically, with a
mis-scaled variant caught), its intervals, and its L2 sensitivities checked
against brute force on small neighbouring datasets.

Goodness-of-fit tests run at significance 1e-4: a correct mechanism fails one
in ten thousand runs. Each is shown to reject noise at half the stated scale.
"""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.dp.accounting import ZCDPAccountant
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.mechanisms import GaussianNoise, calibrate_gaussian, gaussian_for_accuracy
from dpmagic.gate.dp.sums import sum_l2_squared
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.noise import noise
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, exact_vectors, load_table, run_rewritten
from tests.sensitivity_cases import COLUMNS, OFFSET, ORDER, QUERIES, rows_of, unit_rows, units
from tests.statistical import discrete_gaussian_fits


@pytest.mark.parametrize("sigma", [0.8, 3.0, 40.0])
def test_opendp_gaussian_draws_follow_the_stated_scale(sigma):
    assert discrete_gaussian_fits(GaussianNoise(1.0, sigma).sample(20_000), sigma)


@pytest.mark.parametrize("sigma", [3.0, 40.0])
def test_the_fit_rejects_a_gaussian_with_half_the_noise(sigma):
    assert not discrete_gaussian_fits(GaussianNoise(1.0, sigma / 2).sample(20_000), sigma)


def test_gaussian_interval_covers_at_its_stated_rate():
    noise_ = calibrate_gaussian(2.0, 0.05)
    half = noise_.half_width(0.05)
    draws = noise_.sample(20_000)
    inside = sum(abs(d) <= half for d in draws) / len(draws)
    # Binomial(20000, ≥0.95): below 0.94 has probability < 1e-9 for a correct interval.
    assert inside >= 0.94
    # Nor is it padded: one unit narrower it covers visibly less (about 93%).
    assert sum(abs(d) <= half - 1 for d in draws) / len(draws) < 0.97


def test_accuracy_to_gaussian_scale_is_opendps():
    from opendp.accuracy import discrete_gaussian_scale_to_accuracy

    noise_ = gaussian_for_accuracy(1.0, 10.0, 0.05)
    assert noise_.half_width(0.05) <= 10.0
    # A scale one part in 10**6 wider would no longer promise ±10.
    assert discrete_gaussian_scale_to_accuracy(noise_.scale * (1 + 1e-6), 0.05) > 11


def zcdp_plan(sql: str, ds, epsilon: float = 1.0) -> Plan:
    checked = check(resolve(parse(sql), ds))
    return plan(bound(checked), epsilon, 1e-6, ZCDPAccountant())


@pytest.mark.parametrize(
    "sql", ["SELECT g, COUNT(*) FROM t GROUP BY g", "SELECT g, SUM(y) FROM t GROUP BY g"]
)
def test_released_gaussian_noise_has_the_planned_scale(sql):
    cols = {
        "pid": {"type": "int"},
        "g": {"type": "int", "public_values": list(range(500))},
        "y": {"type": "float", "lower": 0.0, "upper": 3.0},
    }
    p = zcdp_plan(sql, dataset(cols, max_partitions=4, max_rows=3), epsilon=0.7)
    (m,) = p.measurements
    assert m.noise.mechanism in ("discrete_gaussian", "granular_gaussian")
    con = duckdb.connect()
    load_table(con, "t", ["pid", "g", "y"], [])
    rw, exact = run_rewritten(p, con, seed=0)
    draws: list[int] = []
    for _ in range(40):
        draws += [round(v / m.noise.granularity) for v in noise(p, rw, exact).values[m.name]]
    assert discrete_gaussian_fits(draws, m.noise.scale)
    assert not discrete_gaussian_fits(draws, m.noise.scale * 2)


def _l2(a: list[int], b: list[int]) -> float:
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


@pytest.mark.search
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=units,
    replacement=unit_rows,
    query=st.sampled_from(QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
    offset=st.booleans(),
)
def test_l2_sensitivity_bounds_every_neighbour(
    per_unit, replacement, query, neighbouring, max_partitions, max_rows, seed, offset
):
    columns = OFFSET if offset else COLUMNS
    ds = dataset(
        columns, neighbouring=neighbouring, max_partitions=max_partitions, max_rows=max_rows
    )
    p = zcdp_plan(query, ds)
    con = duckdb.connect()
    rows = rows_of(per_unit)
    load_table(con, "t", ORDER, rows)
    base = exact_vectors(p, con, seed)
    for pid in range(1, len(per_unit) + 1):
        kept = [r for r in rows if r[0] != pid]
        neighbour = kept
        if neighbouring == "substitute":
            neighbour = kept + [(pid, *r) for r in replacement]
        load_table(con, "t", ORDER, neighbour)
        other = exact_vectors(p, con, seed)
        for m in p.measurements:
            assert _l2(base[m.name], other[m.name]) <= m.noise.sensitivity, (query, m.label)


def test_worst_case_substitution_shares_a_cell():
    """With bounds [-3, 5] a replacement in the same cell (5·3 → -3·3) moves it by 24,
    more in L2 than two disjoint cells of 15 each: sharing is the worst case."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=3, neighbouring="substitute")
    p = zcdp_plan("SELECT g, SUM(x) FROM t GROUP BY g", ds)
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 99, 0.0)] * 3 + [(2, 1, 1, 0.0)])
    high = exact_vectors(p, con, seed=1)
    load_table(con, "t", ORDER, [(1, 0, -99, 0.0)] * 3 + [(2, 1, 1, 0.0)])
    low = exact_vectors(p, con, seed=1)
    (m,) = p.measurements
    assert _l2(high[m.name], low[m.name]) == 24 == pytest.approx(m.noise.sensitivity)


@pytest.mark.parametrize(
    ("lower", "upper", "groups", "rows", "partitions", "add_remove", "substitute"),
    [
        (1, 1, 1, 1, 1, 1, 1),
        (1, 1, 2, 3, 5, 18, 36),  # 2 cells of 3 each; substitute: 4 disjoint cells
        (1, 1, 2, 3, 3, 18, 27),  # 3 partitions: at least one shared
        (-3, 5, 1, 3, 1, 225, 576),  # one shared cell moving 24
        (-3, 5, 1, 3, 4, 225, 576),  # sharing (24²) beats two cells (2·15²)
        (0, 10, 2, 1, 4, 200, 400),  # non-negative: disjoint is the worst
    ],
)
def test_l2_formulas(lower, upper, groups, rows, partitions, add_remove, substitute):
    c = Contribution.bounded(groups, rows, partitions)
    assert sum_l2_squared(lower, upper, c, "add_remove") == add_remove
    assert sum_l2_squared(lower, upper, c, "substitute") == substitute


def test_l2_is_below_l1_for_spread_contributions():
    """Why Gaussian noise helps with many groups: √g instead of g."""
    c = Contribution.bounded(16, 1, 100)
    assert sum_l2_squared(1, 1, c, "add_remove") == 16  # L2 = 4, L1 = 16
