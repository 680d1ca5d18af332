"""A quantile's interval in the column's units (``sql/edges.py``): the levels its ends
are chosen at, its coverage of the group's true quantile, and its part of the cost.

Coverage is statistical: the interval claims 95%; its proof's bound is loose (each
edge's radius holds at 1 − 0.05/3), so misses are rare. Over ``TRIALS`` groups, the
test fails when more than ``MISS_LIMIT`` miss: for a true miss rate of 5% that has
probability below 0.1% (binomial tail), and the same test catches ends chosen
without their radius."""

from __future__ import annotations

import random

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.dp.quantile_selection import Grid, QuantileNoise
from dpmagic.gate.dp.shares import EDGE_WEIGHT, QUANTILE_COUNT_WEIGHT
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.edges import LEVEL_STEPS, edge_names, edge_values, lower_level, upper_level
from dpmagic.gate.sql.noise import noise
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.release import release
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, load_table, make_plan, run_rewritten

TRIALS = 400
MISS_LIMIT = int(binom.ppf(0.999, TRIALS, 0.05))


def _radius(slope: float):
    return lambda p: slope * (1 + abs(p - 0.5))  # grows away from the middle, as r_p does


@settings(max_examples=300, deadline=None)
@given(
    level=st.floats(0.001, 0.999),
    least=st.floats(1, 1e6),
    slope=st.floats(0, 500),
)
def test_edge_levels_are_the_nearest_grid_levels_their_radius_allows(level, least, slope):
    radius = _radius(slope)
    low, high = lower_level(level, least, radius), upper_level(level, least, radius)
    step = 1 / LEVEL_STEPS
    if low is not None:
        assert 0 < low < level and low + radius(low) / least < level
        assert round(low * LEVEL_STEPS) == pytest.approx(low * LEVEL_STEPS)
        up = (round(low * LEVEL_STEPS) + 1) / LEVEL_STEPS  # the next level up does not do
        assert not (up + radius(up) / least < level)
    else:  # no level above 0 does
        assert not (step + radius(step) / least < level)
    if high is not None:
        assert level <= high < 1 and high - radius(high) / least >= level
        down = (round(high * LEVEL_STEPS) - 1) / LEVEL_STEPS
        assert not (down - radius(down) / least >= level)
    else:
        assert not (1 - step - radius(1 - step) / least >= level)


def _true_quantile(counts: dict[int, int], level: float) -> int:
    """The least candidate with at least ``level·n`` values at or below it."""
    n, seen = sum(counts.values()), 0
    for i in sorted(counts):
        seen += counts[i]
        if seen >= level * n:
            return i
    raise AssertionError("an empty group has no quantile")


def _misses(level: float, epsilon: float, draw, trials: int = TRIALS) -> int:
    """Groups whose interval's ends, chosen from a histogram of snapped values and an
    exact count, miss the true quantile's candidate (101 candidates: the proof does not
    depend on the grid's size, and a short one keeps the scoring quick)."""
    g = Grid(0.0, 1000.0, 10.0, 101, False)
    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(trials):
        n = int(rng.choice((200, 1000, 5000)))
        indices = np.clip(np.rint(draw(rng, n) / g.step), 0, g.size - 1).astype(int)
        values, counts = np.unique(indices, return_counts=True)
        histogram = dict(zip(values.tolist(), counts.tolist(), strict=True))
        lows, highs = edge_values(
            level, g.size, 1, epsilon, [histogram], [float(n)], 0.0, lambda i: i
        )
        truth = _true_quantile(histogram, level)
        misses += not (lows[0] <= truth <= highs[0])
    return misses


def _mostly_zero(rng, n):
    """55% zeros, the rest spread past a gap: the values at 0 hold the median."""
    return np.where(rng.random(n) < 0.55, 0.0, rng.uniform(500, 1000, n))


# The median in the default run; the outer levels' coverage with the searches (-m search).
@pytest.mark.parametrize(
    "level", [0.5, *(pytest.param(level, marks=pytest.mark.search) for level in (0.1, 0.9))]
)
@pytest.mark.parametrize(
    "draw",
    [
        lambda r, n: r.uniform(0, 1000, n),
        lambda r, n: r.lognormal(4, 1.2, n),
        lambda r, n: r.normal(500, 40, n),
        _mostly_zero,
        lambda r, n: r.integers(0, 20, n) * 50.0,  # 20 values, each shared by many
    ],
    ids=["uniform", "skewed", "narrow", "mostly-zero", "few-values"],
)
def test_the_interval_holds_the_true_quantile_at_its_level(level, draw):
    assert _misses(level, 0.5, draw) <= MISS_LIMIT


def test_ends_chosen_without_their_radius_are_caught(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(QuantileNoise, "rank_radius", lambda self, alpha: 0.0)
    assert _misses(0.5, 0.5, lambda r, n: r.uniform(0, 1000, n)) > MISS_LIMIT


def test_a_group_that_may_be_empty_spans_the_whole_grid():
    lows, highs = edge_values(0.5, 11, 1, 1.0, [{}, {5: 3}], [0.4, 3.0], 2.5, lambda i: i * 10)
    assert (lows, highs) == ([0, 0], [100, 100])


DS = dataset(
    {
        "pid": {"type": "int"},
        "g": {"type": "int", "public_values": [0, 1]},
        "x": {"type": "int", "lower": 0, "upper": 1000},
    },
    max_partitions=1,
    max_rows=1,
)


def test_a_query_without_a_count_gets_one_and_the_interval_through_the_gates_passes():
    """On a real DuckDB: the plan adds COUNT(x) at its stated weight, the edges take
    theirs, and the released column carries an interval in units around the value."""
    p = make_plan("SELECT g, MEDIAN(x) AS m FROM t GROUP BY g", DS, epsilon=2.0)
    assert [m.label for m in p.measurements] == ["COUNT(x)"]
    (s,) = p.selections
    weights = 1 + 2 * EDGE_WEIGHT + QUANTILE_COUNT_WEIGHT
    assert s.epsilon == pytest.approx(2.0 / weights, rel=1e-9)
    assert s.edges.epsilon == pytest.approx(EDGE_WEIGHT * s.epsilon, rel=1e-9)
    count_cost = p.measurements[0].cost.epsilon
    assert count_cost == pytest.approx(QUANTILE_COUNT_WEIGHT * s.epsilon, rel=1e-9)
    spent = s.epsilon + 2 * s.edges.epsilon + count_cost
    assert spent <= 2.0 * (1 + 1e-9) and spent == pytest.approx(p.epsilon, rel=1e-9)

    con = duckdb.connect()
    rng = random.Random(3)
    rows = [(i, i % 2, rng.randrange(0, 1001) if i % 2 else 500 + rng.randrange(-20, 21))
            for i in range(4000)]  # fmt: skip
    load_table(con, "t", ["pid", "g", "x"], rows)
    rewritten, exact = run_rewritten(p, con, seed=1)
    noisy = noise(p, rewritten, exact)
    low, high = edge_names(s.name)
    column = release(noisy).accuracy["columns"][1]
    for i, (lo, hi) in enumerate(column["intervals"]):
        assert [lo, hi] == [noisy.values[low][i], noisy.values[high][i]] and lo <= hi
    narrow, wide = (hi - lo for lo, hi in column["intervals"])
    assert narrow < wide  # values within 500 ± 20, against values over [0, 1000]
    assert column["noise_dominates"] == [False, False] and column["count"] == "COUNT(x)"


def test_a_clips_bounds_spend_nothing_on_intervals():
    """``--clip``'s first release only feeds the query: its quantiles keep all of ε."""
    bounded = bound(check(resolve(parse("SELECT MEDIAN(x) AS m FROM t"), DS)))
    p = plan(bounded, 1.0, 0.0, PureAccountant(), quantile_intervals=False)
    (s,) = p.selections
    assert not p.measurements and s.edges is None and s.epsilon == pytest.approx(1.0)
