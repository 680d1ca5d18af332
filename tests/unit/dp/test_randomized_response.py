"""``dp/randomized_response``: the debiased count and sum are unbiased, computed
exactly over every outcome of the randomization for small populations; a map that
forgets the random answers' share is caught."""

from __future__ import annotations

import itertools

import pytest

from dpmagic.gate.dp.randomized_response import random_share, true_count, true_sum

VALUES = (0, 1, 3)  # the column's public values


def _outcomes(truth: tuple[int, ...], p: float):
    """Every vector of reports, with its probability."""
    r = random_share(p, len(VALUES))
    per_person = [[(v, (p if v == x else 0.0) + r) for v in VALUES] for x in truth]
    for combo in itertools.product(*per_person):
        prob = 1.0
        for _, q in combo:
            prob *= q
        yield tuple(v for v, _ in combo), prob


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("truth", [(0,), (1, 3), (0, 0, 3), (3, 3, 1, 0)])
def test_the_debiased_count_and_sum_are_unbiased(truth, p):
    mean = sum(VALUES) / len(VALUES)
    for v in VALUES:
        expected = sum(
            prob * true_count(sum(1 for x in reports if x == v), len(truth), p, len(VALUES))
            for reports, prob in _outcomes(truth, p)
        )
        assert expected == pytest.approx(sum(1 for x in truth if x == v))
    expected_sum = sum(
        prob * true_sum(sum(reports), len(truth), p, mean) for reports, prob in _outcomes(truth, p)
    )
    assert expected_sum == pytest.approx(sum(truth))


def test_a_count_that_forgets_the_random_answers_is_caught():
    truth, p = (0, 0, 3), 0.5
    expected = sum(
        prob * sum(1 for x in reports if x == 3) / p for reports, prob in _outcomes(truth, p)
    )
    assert expected != pytest.approx(1)  # c_v/p alone over-counts v
