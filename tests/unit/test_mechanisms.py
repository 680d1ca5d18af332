"""Statistical tests of the noise: the released noise has the stated scale.

Each goodness-of-fit test compares draws with the exact discrete Laplace pmf
(P(k) ∝ exp(-|k|/scale)) by a chi-square test at significance 1e-4: a correct
mechanism fails it once in ten thousand runs. The same test is shown to
reject a mechanism whose scale is off by a factor of two, so it has teeth.
"""

from __future__ import annotations

import math

import duckdb
import pytest

from dpmagic.gate.dp.mechanisms import LaplaceNoise, calibrate
from dpmagic.gate.sql.noise import noise
from tests.gate_helpers import dataset, load_table, make_plan, run_rewritten
from tests.statistical import discrete_laplace_fits


@pytest.mark.parametrize("scale", [0.7, 3.0, 12.5])
def test_opendp_draws_follow_the_stated_scale(scale):
    draws = LaplaceNoise(sensitivity=1, scale=scale).sample(20_000)
    assert discrete_laplace_fits(draws, scale)


@pytest.mark.parametrize("scale", [3.0, 12.5])
def test_the_fit_rejects_a_mis_scaled_mechanism(scale):
    """A broken mechanism that adds half the noise it claims is caught."""
    draws = LaplaceNoise(sensitivity=1, scale=scale / 2).sample(20_000)
    assert not discrete_laplace_fits(draws, scale)


def test_calibration_follows_opendp_privacy_map():
    noise_ = calibrate(sensitivity=8, epsilon=0.5)
    assert noise_.epsilon <= 0.5
    assert noise_.scale == pytest.approx(16.0)
    assert calibrate(sensitivity=8, epsilon=0.5, granularity=0.25).half_width(0.05) == (
        pytest.approx(math.floor(noise_.half_width(0.05)) * 0.25)
    )


def test_interval_covers_95_percent():
    noise_ = calibrate(sensitivity=3, epsilon=0.4)
    half = noise_.half_width(0.05)
    draws = noise_.sample(20_000)
    inside = sum(abs(d) <= half for d in draws) / len(draws)
    # Binomial(20000, ≥0.95): below 0.94 has probability < 1e-9 for a correct interval.
    assert inside >= 0.94


COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": list(range(500))},
    "y": {"type": "float", "lower": 0.0, "upper": 3.0},
}


@pytest.mark.parametrize(
    ("sql", "label"),
    [
        ("SELECT g, COUNT(*) FROM t GROUP BY g", "COUNT(*)"),
        ("SELECT g, SUM(y) FROM t GROUP BY g", "SUM(y)"),
    ],
)
def test_released_noise_through_the_pipeline_has_the_planned_scale(sql, label):
    """On an empty table every released cell is pure noise: over 40 queries of 500
    partitions the noise must fit the scale the plan states (in grid units)."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=3)
    p = make_plan(sql, ds, epsilon=0.7)
    (m,) = [m for m in p.measurements if m.label == label]
    con = duckdb.connect()
    load_table(con, "t", ["pid", "g", "y"], [])
    rw, exact = run_rewritten(p, con, seed=11)
    draws: list[int] = []
    for _ in range(40):
        values = noise(p, rw, exact).values[m.name]
        draws += [round(v / m.noise.granularity) for v in values]
    assert m.noise.scale == pytest.approx(m.noise.sensitivity / 0.7)
    assert discrete_laplace_fits(draws, m.noise.scale)
    assert not discrete_laplace_fits(draws, m.noise.scale * 2)


@pytest.mark.search  # 20,000 draws through OpenDP, one call each: with the searches
def test_granular_noise_equals_opendps_float_laplace():
    """OpenDP's float Laplace with granularity 2**k draws integers on the 2**k grid
    from discrete Laplace(scale / 2**k): the distribution our fixed-point sums use."""
    import opendp.prelude as dp

    k, scale = -3, 2.5
    float_laplace = dp.m.make_laplace(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=scale, k=k
    )
    draws = [float_laplace(0.0) / 2.0**k for _ in range(20_000)]
    assert all(d == int(d) for d in draws)
    assert discrete_laplace_fits([int(d) for d in draws], scale / 2.0**k)
    ours = LaplaceNoise(sensitivity=1, scale=scale / 2.0**k, granularity=2.0**k).sample(20_000)
    assert discrete_laplace_fits(ours, scale / 2.0**k)


@pytest.mark.search
@pytest.mark.parametrize("scale", [1.0001e4, 3.3e4, 1e5, 4.7e5, 1e6, 2e6])
def test_a_wide_gaussian_interval_is_never_narrower_than_opendps(scale):
    """Beyond ``GAUSSIAN_EXACT_SCALE`` the interval is the continuous quantile plus two
    units, not OpenDP's term-by-term sum (linear in the scale): checked here to be
    never narrower than OpenDP's at each level, and at most 12 units wider. Without
    the two units it would be narrower at some of these (the bound is tight)."""
    from opendp.accuracy import discrete_gaussian_scale_to_accuracy

    from dpmagic.gate.dp.mechanisms import _gaussian_half_width, _integer_half_width

    for alpha in (0.5, 0.2, 0.05, 0.01, 1e-3, 1e-6):
        exact = _integer_half_width(discrete_gaussian_scale_to_accuracy(scale, alpha))
        fast = _gaussian_half_width(scale, alpha)
        assert exact <= fast <= exact + 12, (scale, alpha, exact, fast)
