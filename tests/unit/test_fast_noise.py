"""The vectorised discrete Laplace sampler against OpenDP's own.

Each comparison is a chi-square test at significance 1e-4 (a correct sampler
fails one run in 10,000): two-sample (ours against draws from OpenDP's
measurement) and one-sample (ours against the exact pmf). The same tests are
shown to reject a sampler whose scale is 10% off, and the exact-integer
continuations that run once in 1/128! draws are forced and checked too.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpmagic.gate.dp import fast_noise, mechanisms
from dpmagic.gate.dp.fast_noise import discrete_laplace, exact_scale
from dpmagic.gate.dp.mechanisms import FAST_NOISE_CELLS, LaplaceNoise, _laplace_vector
from tests.statistical import SIGNIFICANCE, discrete_laplace_fits

SCALES = [0.7, 3.0, 5 / 0.7, 1234.5, 2.0**20 + 0.25]


def _same_distribution(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    """Two-sample chi-square on bins cut at multiples of the scale, sparse bins pooled."""
    cuts = np.unique(np.floor(scale * np.arange(-16, 17) / 4))
    table = np.array(
        [np.bincount(np.searchsorted(cuts, x), minlength=cuts.size + 1) for x in (a, b)]
    )
    expected = table.sum(0) * table.sum(1)[:, None] / table.sum()
    keep = expected.min(0) >= 5
    pooled = np.column_stack([table[:, keep], table[:, ~keep].sum(1)])
    pooled = pooled[:, pooled.sum(0) > 0]
    _, pvalue, _, _ = stats.chi2_contingency(pooled)
    return pvalue > SIGNIFICANCE


def _draws(t: int, s: int, total: int, size: int) -> np.ndarray:
    """``total`` draws in vectors of ``size``: short vectors take the blocked steps
    (``BLOCKED_CELLS``), long ones the one-at-a-time steps."""
    return np.concatenate([discrete_laplace(t, s, size) for _ in range(total // size)])


# One long vector; 1,200 short ones; 7,500 of the shortest the fast path serves.
SIZES = [60_000, 50, FAST_NOISE_CELLS]


@pytest.mark.search
@pytest.mark.parametrize("size", SIZES, ids=["long", "short", "shortest"])
@pytest.mark.parametrize("scale", SCALES)
def test_fast_sampler_draws_opendps_distribution(scale, size):
    t, s = exact_scale(scale)
    ours = _draws(t, s, 60_000, size)
    theirs = np.array(_laplace_vector(scale)([0] * 30_000))
    assert _same_distribution(ours, theirs, scale)
    assert discrete_laplace_fits(ours.tolist(), scale)


# The shortest vectors (the slowest to draw) with the searches (``-m search``).
@pytest.mark.parametrize(
    "size",
    [*SIZES[:2], pytest.param(SIZES[2], marks=pytest.mark.search)],
    ids=["long", "short", "shortest"],
)
@pytest.mark.parametrize("scale", [3.0, 1234.5])
def test_the_comparison_catches_a_scale_ten_percent_off(scale, size):
    t, s = exact_scale(scale * 1.10)
    wrong = _draws(t, s, 60_000, size)
    theirs = np.array(_laplace_vector(scale)([0] * 30_000))
    assert not _same_distribution(wrong, theirs, scale)
    assert not discrete_laplace_fits(wrong.tolist(), scale)


@pytest.mark.parametrize("size", [20_000, 50], ids=["long", "short"])
def test_the_rare_exact_continuations_keep_the_distribution(monkeypatch, size):
    """With the vectorised loops cut after one step, nearly every draw finishes in
    Python integers: the result must still be discrete Laplace."""
    monkeypatch.setattr(fast_noise, "STEPS", 1)
    t, s = exact_scale(2.5)
    draws = _draws(t, s, 20_000, size)
    assert discrete_laplace_fits(draws.tolist(), 2.5)


def test_scales_are_taken_exactly_as_opendp_takes_them():
    for scale in SCALES:
        t, s = exact_scale(scale)
        assert Fraction(t, s) == Fraction(scale)
    assert exact_scale(2.0**70) is None  # too large for 64-bit steps: OpenDP's sampler


def test_uniform_integers_have_no_modulo_bias():
    """A bound just above 2**63 rejects half the words; the kept ones must still be
    uniform (a plain `% bound` would put twice the mass on the low half)."""
    bound = 2**63 + 2**61
    draws = fast_noise._uniform(bound, 40_000)
    assert (draws < np.uint64(bound)).all()
    low = int((draws < np.uint64(bound // 2)).sum())
    # Binomial(40000, 1/2): outside ±4.5 sd has probability below 1e-5.
    assert abs(low - 20_000) < 4.5 * math.sqrt(10_000)
    small = fast_noise._uniform_each(np.full(30_000, 3, dtype=np.uint64))
    assert stats.chisquare(np.bincount(small.astype(np.int64), minlength=3)).pvalue > SIGNIFICANCE


def _thirds_even(draws: np.ndarray, bound: int) -> bool:
    """Whether the draws fall in the three thirds of ``[0, bound)`` evenly (chi-square
    at ``SIGNIFICANCE``), and all below ``bound``."""
    if not (draws.astype(np.uint64) < np.uint64(bound)).all():
        return False
    thirds = np.minimum(draws.astype(np.uint64) // np.uint64(-(-bound // 3)), np.uint64(2))
    counts = np.bincount(thirds.astype(np.int64), minlength=3)
    return bool(stats.chisquare(counts).pvalue > SIGNIFICANCE)


# Each word width's largest bound, its next, and a bound rejecting a quarter of the
# words: 3·2**14 in 16 bits, 3·2**30 in 32.
NARROW_BOUNDS = [3, 2**16 - 1, 2**16, 3 * 2**14, 3 * 2**30, 2**32 - 1, 2**32]


@pytest.mark.parametrize("bound", NARROW_BOUNDS)
def test_uniform_integers_from_narrow_words_are_uniform(bound):
    """Bounds below 2**16 and 2**32 are drawn from 16- and 32-bit words, each with its
    own rejection floor."""
    assert _thirds_even(fast_noise._uniform(bound, 60_000), bound)


def test_the_thirds_catch_narrow_words_without_their_rejection():
    """The broken version: 16-bit words taken modulo 3·2**14 unrejected put half the
    mass on the lowest third."""
    words = fast_noise._words(60_000, np.uint16)
    assert not _thirds_even(words % np.uint16(3 * 2**14), 3 * 2**14)


def _exp_minus_one(draws: np.ndarray) -> bool:
    """Whether the share of successes is exp(-1), within 4.5 standard deviations
    (a correct sampler fails about once in 150,000 runs)."""
    n, p = draws.size, math.exp(-1)
    return abs(int(draws.sum()) - n * p) < 4.5 * math.sqrt(n * p * (1 - p))


def test_bernoulli_exp_one_from_one_word_succeeds_with_exp_minus_one():
    assert _exp_minus_one(fast_noise._bernoulli_exp_one(200_000))


def test_the_count_catches_thresholds_one_trial_off(monkeypatch):
    """The broken versions: the thresholds of ``k + 1`` read for ``k`` (every draw's
    parity flipped: 1 − e⁻¹), and a table over 20! whose words are taken modulo 20!
    unrejected (its low 58% more likely than the rest, 8 words to 7: 0.388 rather
    than 0.368; below the multiple of 15! in use a word is rejected once in 6·10⁷)."""
    room, table = fast_noise.ROOM, fast_noise.ALL_SUCCEED
    off = np.concatenate([table[1:], [room]]).astype(np.uint64)
    monkeypatch.setattr(fast_noise, "ALL_SUCCEED", off)
    assert not _exp_minus_one(fast_noise._bernoulli_exp_one(200_000))
    monkeypatch.undo()

    twenty = math.factorial(20)
    thresholds = [twenty // math.factorial(k) for k in range(20, 1, -1)]
    monkeypatch.setattr(fast_noise, "ROOM", twenty)
    monkeypatch.setattr(fast_noise, "ALL_SUCCEED", np.array(thresholds, dtype=np.uint64))

    def unrejected(bound: int, n: int) -> np.ndarray:
        return fast_noise._words(n, np.uint64) % np.uint64(bound)

    assert _exp_minus_one(fast_noise._bernoulli_exp_one(200_000))  # rejected: right
    monkeypatch.setattr(fast_noise, "_uniform", unrejected)
    assert not _exp_minus_one(fast_noise._bernoulli_exp_one(1_000_000))


def test_bernoulli_exp_one_goes_on_exactly_past_its_table(monkeypatch):
    """With the table cut to 3! (``A_2``, ``A_3``), one draw in six has all its
    trials succeed and goes on from ``A_4`` in Python integers: still exp(-1)."""
    monkeypatch.setattr(fast_noise, "ROOM", 6)
    monkeypatch.setattr(fast_noise, "ALL_SUCCEED", np.array([1, 3], dtype=np.uint64))
    monkeypatch.setattr(fast_noise, "COMPARED", 1)
    assert _exp_minus_one(fast_noise._bernoulli_exp_one(60_000))


def test_long_vectors_take_the_fast_path_and_short_ones_opendps(monkeypatch):
    calls = []

    def counted(t, s, size):
        calls.append(size)
        return discrete_laplace(t, s, size)

    monkeypatch.setattr(mechanisms, "discrete_laplace", counted)
    noise = LaplaceNoise(sensitivity=1, scale=4.0)
    draws = noise.sample(FAST_NOISE_CELLS * 20)
    assert calls == [FAST_NOISE_CELLS * 20] and all(isinstance(d, int) for d in draws)
    assert discrete_laplace_fits(draws, 4.0)
    assert len(noise.sample(FAST_NOISE_CELLS - 1)) == FAST_NOISE_CELLS - 1
    assert calls == [FAST_NOISE_CELLS * 20]
