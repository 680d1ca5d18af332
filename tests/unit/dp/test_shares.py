"""``dp/shares``: the split of a query's budget minimises the error it says it does,
against every split on a grid, for Laplace and Gaussian noise; an even split is
worse where the coefficients differ; the weights add up to the number of parts."""

from __future__ import annotations

import itertools
import math

import pytest

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.shares import avg_weights, split, variance_weights
from dpmagic.gate.policy import Neighbouring

COEFFICIENTS = [(1.0, 1.0), (3.0, 1.0), (1.0, 0.2, 5.0), (2.0, 0.5 / math.sqrt(3), 0.7)]


def _error(weights: tuple[float, ...], coefficients: tuple[float, ...], gaussian: bool) -> float:
    """``Σ (a_i·noise_i)²`` up to a constant factor, each part's budget its weight:
    ``a_i²/ε_i²`` for Laplace, ``a_i²/ρ_i`` for Gaussian."""
    power = 1 if gaussian else 2
    return math.fsum(a * a / w**power for a, w in zip(coefficients, weights, strict=True))


def _grid(parts: int, steps: int = 60):
    """Every split of ``parts`` units of budget on a grid of ``steps`` per part."""
    total = parts * steps
    for cut in itertools.product(range(1, total), repeat=parts - 1):
        last = total - sum(cut)
        if last >= 1:
            yield tuple(c / steps for c in (*cut, last))


@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize("coefficients", COEFFICIENTS)
def test_the_split_beats_every_split_on_a_grid(coefficients, gaussian):
    chosen = split(coefficients, gaussian)
    assert math.fsum(chosen) == pytest.approx(len(coefficients))
    best = _error(chosen, coefficients, gaussian)
    assert all(
        best <= _error(w, coefficients, gaussian) * (1 + 1e-12) for w in _grid(len(coefficients))
    )


@pytest.mark.parametrize("gaussian", [False, True])
def test_an_even_split_loses_where_the_coefficients_differ(gaussian):
    """The peers' even split: caught by the same comparison."""
    coefficients = (3.0, 1.0)
    even = (1.0, 1.0)
    assert _error(split(coefficients, gaussian), coefficients, gaussian) < _error(
        even, coefficients, gaussian
    )


@pytest.mark.parametrize("relation", list(Neighbouring))
@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize(("groups", "rows"), [(1, 1), (2, 3), (4, 4)])
def test_an_averages_and_a_variances_weights_add_up_to_their_parts(
    groups, rows, gaussian, relation
):
    c = Contribution.bounded(groups, rows, 5)
    assert math.fsum(avg_weights(c, relation, gaussian)) == pytest.approx(2)
    assert math.fsum(variance_weights(c, relation, gaussian)) == pytest.approx(3)
    weights = (*avg_weights(c, relation, gaussian), *variance_weights(c, relation, gaussian))
    assert all(w > 0 for w in weights)
