"""``dp/left_out``: the bounding report's two noises are calibrated to no less than what
one unit can move the totals they count, found by enumerating every unit's rows before
and after bounding, added, removed or replaced; and the report takes the share of the
query's whole budget it was asked for, of which its two noises spend no more. A rule
that forgets the cap, and a share taken of the rest of the budget rather than of the
whole, are caught (the last tests)."""

from __future__ import annotations

import itertools
import math

import pytest

from dpmagic.gate.dp import calibration
from dpmagic.gate.dp import left_out as rule
from dpmagic.gate.dp.accounting import ApproxAccountant, PureAccountant, ZCDPAccountant
from dpmagic.gate.dp.calibration import Target
from dpmagic.gate.dp.shares import part_share
from dpmagic.gate.policy import Neighbouring

ACCOUNTANTS = [PureAccountant(), ApproxAccountant(), ZCDPAccountant()]
CAPS = [1, 2, 5]


def _terms(rows: int, kept: int, cap: int) -> tuple[int, int]:
    """One unit's terms, as ``rewrite.left_out`` computes them: its rows left out,
    counted up to ``cap``, and whether it had any."""
    left = min(max(rows - kept, 0), cap)
    return left, int(left > 0)


def _worst(cap: int, relation: Neighbouring) -> tuple[int, int]:
    """The most one unit moves the two totals: every unit of up to ``cap + 2`` rows and
    any number kept (an empty unit too), added or removed, or replaced by another."""
    every = {_terms(rows, kept, cap) for rows in range(cap + 3) for kept in range(rows + 2)}
    if relation == Neighbouring.ADD_REMOVE:
        pairs = [(u, (0, 0)) for u in every]
    else:
        pairs = list(itertools.product(every, every))
    return (
        max(abs(a[0] - b[0]) for a, b in pairs),
        max(abs(a[1] - b[1]) for a, b in pairs),
    )


def _noises(cap: int, relation: Neighbouring, accountant):
    delta = 0.0 if accountant.name == "pure" else 1e-6
    asked = accountant.query_cost(1.0, delta)
    half = Target(accountant, share=accountant.share(asked, 4.0))
    return rule.left_out(0.5, cap, relation, half, accountant.share(asked, 2.0))


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
@pytest.mark.parametrize("relation", list(Neighbouring))
@pytest.mark.parametrize("cap", CAPS)
def test_the_noises_cover_what_one_unit_moves(cap, relation, accountant):
    report = _noises(cap, relation, accountant)
    rows, units = _worst(cap, relation)
    assert (rows, units) == (cap, 1)  # the statement's bounds, found
    # One value per unit in one partition: its L1 and L2 norms are the same.
    assert report.rows.sensitivity >= rows and report.units.sensitivity >= units
    assert report.cap == cap


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
@pytest.mark.parametrize("report", [0.01, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("others", [0.25, 1.0, 3.5, 40.0])
def test_the_report_takes_its_share_of_the_whole(others, report, accountant):
    delta = 0.0 if accountant.name == "pure" else 1e-6
    asked = accountant.query_cost(2.0, delta)
    weight = rule.report_weight(others, report)
    total = others + weight
    charged = rule.report_cost(accountant, asked, total, weight)
    unit = (lambda c: c.rho) if accountant.gaussian else (lambda c: c.epsilon)
    assert unit(charged) == pytest.approx(report * unit(asked), rel=1e-12)
    halves = [part_share(accountant, asked, total, weight / 2) for _ in range(2)]
    assert math.fsum(unit(h) for h in halves) <= unit(charged)


def test_a_rule_that_forgets_the_cap_is_caught(monkeypatch):
    """The rows total's noise calibrated as a count of units (one row each): the
    enumeration finds a unit that moves it by ``cap``."""

    def broken(lower, upper, contribution, neighbouring, target, granularity=1.0):
        return calibration.count_noise_for(contribution, neighbouring, target)

    monkeypatch.setattr(rule, "noise_for", broken)
    with pytest.raises(AssertionError):
        test_the_noises_cover_what_one_unit_moves(2, Neighbouring.ADD_REMOVE, PureAccountant())


def test_a_share_of_the_rest_is_caught(monkeypatch):
    """``w = T·report`` (a share of the query's other parts, not of the whole): the
    report is charged less than asked, and the query's parts more."""
    monkeypatch.setattr(rule, "report_weight", lambda total, report: total * report)
    with pytest.raises(AssertionError):
        test_the_report_takes_its_share_of_the_whole(1.0, 0.5, PureAccountant())
