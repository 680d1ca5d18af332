"""``dp/centred_sums``: every row's term of a centred sum lies in the rule's bounds,
against every value a row can add (its clamped value, and 0 where the sum may read a
NULL) for every small grid range; the bounds are the range's middle ± half its
width; a rule that forgets the 0 where it can be read is caught."""

from __future__ import annotations

import pytest

from dpmagic.gate.dp.centred_sums import centre, centred_bounds

RANGES = [(lo, hi) for lo in range(-6, 7) for hi in range(lo, 8)]


def _terms(lo: int, hi: int, units: int, per_grid: int, exact: bool) -> set[int]:
    """What one counted row can add to the centred sum: its value, or 0 where the sum
    may read NULL while the count counts the row (not ``exact``)."""
    values = range(lo, hi + 1) if exact else (*range(lo, hi + 1), 0)
    return {per_grid * v - units for v in values}


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("integral", [True, False])
def test_every_rows_term_lies_in_the_bounds_and_they_are_attained(integral, exact):
    for lo, hi in RANGES:
        found = centre(lo, hi, integral, exact) or (0, 1)
        low, high = centred_bounds(lo, hi, *found, exact)
        terms = _terms(lo, hi, *found, exact)
        assert min(terms) == low and max(terms) == high, (lo, hi)


@pytest.mark.parametrize("exact", [True, False])
def test_the_bounds_are_the_middle_plus_or_minus_half_the_width(exact):
    for lo, hi in RANGES:
        units, per_grid = centre(lo, hi, True, exact) or (0, 1)
        low, high = centred_bounds(lo, hi, units, per_grid, exact)
        assert low == -high  # whole or half units: the middle exactly
        width = hi - lo if exact else max(hi, 0) - min(lo, 0)
        assert high == per_grid * width / 2
        # never wider than the raw sum's reach, and at most half of it off 0
        assert high / per_grid <= max(abs(lo), abs(hi))
        if lo >= 0 or hi <= 0:
            assert high / per_grid <= max(abs(lo), abs(hi)) / 2


def test_an_offset_range_counted_exactly_is_noised_for_its_width_alone():
    """A column declared 2019–2024, summed where its count counts exactly its rows: each
    term within ±2.5 of the middle (±5 in half units), not ±1012 as it would be if a
    counted row could add 0."""
    assert centred_bounds(2019, 2024, *centre(2019, 2024, True, True), True) == (-5, 5)
    assert centred_bounds(2019, 2024, *centre(2019, 2024, True, False), False) == (-1012, 1012)


def test_bounds_that_forget_the_null_read_as_0_are_caught():
    """The exact bounds used where a counted row may add 0: some term falls outside."""
    missed = []
    for lo, hi in RANGES:
        found = centre(lo, hi, True, False) or (0, 1)
        low, high = centred_bounds(lo, hi, *found, True)
        terms = _terms(lo, hi, *found, False)
        if not low <= min(terms) <= max(terms) <= high:
            missed.append((lo, hi))
    assert missed
