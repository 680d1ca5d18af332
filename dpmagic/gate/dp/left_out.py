"""Rule: the bounding report, a noisy count of the rows a query's contribution bounds
left out and of the units that had rows left out, bought with a share of the query's
budget (the rest goes to the query's own measurements). What a reply says about it is
``sql/bounding_report.py``'s; its SQL is ``rewrite.left_out``.

**Sensitivity** (``left_out``). Each unit's left-out rows are counted up to ``cap``:
``rewrite.left_out`` computes, per unit, ``min(max(all − kept, 0), cap)``, a function
of that unit's own rows. The rows total is then a sum of one value in ``[0, cap]``
per unit, and the units count a count of one row per unit, both in one partition:
adding or removing a unit moves them by at most ``cap`` and 1, and replacing one
unit by another replaces one term by another in the same range. Their sensitivities
are those of ``sum_sensitivity(0, cap)`` and of a count, for one row of one unit in
one partition.

**Share** (``report_weight``, ``report_cost``). Beside the query's own parts, of total
weight ``T`` (``shares``), the report takes the weight ``w`` with ``w / (T + w) =
report``, ``w = T·report/(1 − report)``: ``report`` of the whole budget, at most
``MAX_REPORT_SHARE``. Each of its two noises is calibrated to the share of half
that weight, rounded down (``shares.part_share``), and the report is charged the
whole weight's share, so its two noises together cost no more than its charge.

``tests/unit/dp/test_left_out.py`` checks both by enumeration: every unit's rows
before and after bounding, added, removed or replaced, against the noises'
sensitivities; and the share against ``report`` over weights, shares and accountants.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.dp.calibration import Target, count_noise_for, noise_for
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.mechanisms import Noise
from dpmagic.gate.policy import Neighbouring

MAX_REPORT_SHARE = 0.9
"""The largest share of a query's budget the bounding report may take."""


@dataclass(frozen=True)
class LeftOut:
    """The bounding report's noises: the rows left out, each unit's counted up to
    ``cap``, and the units with rows left out, bought with ``share`` of the query's
    budget; ``cost`` is the two noises' cost together, part of the query's."""

    share: float
    cap: int
    rows: Noise
    units: Noise
    cost: Cost


def report_weight(total_weight: float, report: float) -> float:
    """The weight ``w`` that takes ``report`` of the whole beside parts of
    ``total_weight``: ``w / (total_weight + w) = report``."""
    return total_weight * report / (1 - report)


def report_cost(accountant: Accountant, asked: Cost, total_weight: float, weight: float) -> Cost:
    """What the report is charged: its weight's share of the query's cost, of which
    each of its two noises has half, rounded down."""
    return accountant.share(asked, total_weight / weight)


def left_out(
    report: float, cap: int, neighbouring: Neighbouring, half: Target, whole: Cost
) -> LeftOut:
    """The report's two noises, each calibrated to ``half`` of its share: a sum of one
    value in ``[0, cap]`` and a count of one row, of one unit in one partition."""
    one = Contribution.bounded(1, 1, 1)
    rows = noise_for(0, cap, one, neighbouring, half)
    units = count_noise_for(one, neighbouring, half)
    return LeftOut(report, cap, rows, units, whole)
