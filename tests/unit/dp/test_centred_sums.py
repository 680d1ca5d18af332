"""``dp/centred_sums``: every row's term of a centred sum lies in the rule's bounds,
against every value a row can add (its clamped value, or 0 where the sum reads a
NULL) for every small grid range; the bounds are the range's middle ± half its
width; a rule that forgets the 0 is caught."""

from __future__ import annotations

import pytest

from dpmagic.gate.dp.centred_sums import centre, centred_bounds

RANGES = [(lo, hi) for lo in range(-6, 7) for hi in range(lo, 8)]


def _terms(lo: int, hi: int, units: int, per_grid: int) -> set[int]:
    """What one counted row can add to the centred sum."""
    return {per_grid * v - units for v in (*range(lo, hi + 1), 0)}


@pytest.mark.parametrize("integral", [True, False])
def test_every_rows_term_lies_in_the_bounds_and_they_are_attained(integral):
    for lo, hi in RANGES:
        found = centre(lo, hi, integral) or (0, 1)
        low, high = centred_bounds(lo, hi, *found)
        terms = _terms(lo, hi, *found)
        assert min(terms) == low and max(terms) == high, (lo, hi)


def test_the_bounds_are_the_middle_plus_or_minus_half_the_width():
    for lo, hi in RANGES:
        units, per_grid = centre(lo, hi, True) or (0, 1)
        low, high = centred_bounds(lo, hi, units, per_grid)
        assert low == -high  # whole or half units: the middle exactly
        width = max(hi, 0) - min(lo, 0)
        assert high == per_grid * width / 2
        # never wider than the raw sum's reach, and half of it off 0
        assert high / per_grid <= max(abs(lo), abs(hi))
        if lo >= 0 or hi <= 0:
            assert high / per_grid == max(abs(lo), abs(hi)) / 2


def test_bounds_that_forget_the_null_read_as_0_are_caught():
    def forgetful(lo: int, hi: int, units: int, per_grid: int) -> tuple[int, int]:
        return per_grid * lo - units, per_grid * hi - units

    missed = [
        (lo, hi)
        for lo, hi in RANGES
        if lo > 0
        and not (
            forgetful(lo, hi, *(centre(lo, hi, True) or (0, 1)))[0]
            <= min(_terms(lo, hi, *(centre(lo, hi, True) or (0, 1))))
        )
    ]
    assert missed
