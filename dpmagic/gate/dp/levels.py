"""Rule: the level each part of an interval is computed at, so that the interval holds
at the level it is released at.

A released interval is often built from several events: each aggregate of an
expression lies in its own interval, a variance's count and two sums lie in
theirs, a quantile's band needs its count's interval and its rank radius. The
rule is the union bound (Bonferroni): if each of ``k`` events fails with
probability at most ``α_i`` and ``Σ α_i ≤ α``, all hold together with
probability at least ``1 − α``.

Proof: ``P(some event fails) ≤ Σ P(event i fails) ≤ Σ α_i ≤ α`` (Boole's
inequality), whatever the events' dependence; and whenever every part lies in
its interval, an interval that contains every value its parts' intervals allow
(interval arithmetic, a box's corners) contains the truth.

So ``k`` parts at ``α/k`` each hold together at ``1 − α`` (``split``; to within
the float rounding of ``α/k``: at most a relative 2⁻⁵³ of ``α`` in all). Each use
below is that split with its ``k``; an interval computed from its parts' joint
distribution (Fieller's set, the calibrated variance) is one event and takes the
whole level (``joint_level``). Nothing here reads data: every level is a
function of the asked level and the plan's shape.

``tests/unit/dp/test_levels.py`` checks, over many draws of OpenDP-calibrated
noise for each split, that the parts' intervals hold together at least ``1 − α``
of the time (and that a split at ``α/2`` for three parts, or no split, is
caught), and enumerates that every split adds back up to at most ``α``.
"""

from __future__ import annotations

REPORT_ALPHA = 0.05
"""The level every plan step's interval is reported at (95%), whatever the query
asked for; a quantile's interval is computed at this level only (``EDGES_ALPHA``)."""

EDGES_ALPHA = REPORT_ALPHA
"""The one level a quantile's interval ends are chosen at (``sql/edges.py``): their
levels are picked per group, with the budget spent before the query's level is
known."""


def split(alpha: float, parts: int) -> float:
    """The level of each of ``parts`` events that must hold together at ``1 − alpha``:
    ``alpha/parts``, whose ``parts`` failures add up to ``alpha`` (the union bound)."""
    return alpha / parts


def expression_level(alpha: float, aggregates: int) -> float:
    """Each aggregate's level in an expression of ``aggregates`` of them (``a/b``,
    ``a + b``): interval arithmetic over their intervals holds when all of them do,
    so each is at ``alpha/aggregates``. A bare aggregate (one) keeps ``alpha``."""
    return split(alpha, aggregates)


VARIANCE_PARTS = 3
"""A variance's measurements: its count, its centred sum and its sum of squares."""


def variance_box_level(alpha: float) -> float:
    """Each of a variance's three measurements' level where its interval is the box of
    theirs (``sql/intervals.variance_box``): the box holds the variance when all three
    intervals hold, so ``alpha/3`` each."""
    return split(alpha, VARIANCE_PARTS)


def average_box_level(alpha: float) -> float:
    """The sum's and the count's level where an average's interval is the box of theirs
    (the corners of ``centre + S/N``): the box holds the average when both do, so
    ``alpha/2`` each."""
    return split(alpha, 2)


def joint_level(alpha: float) -> float:
    """The level of an interval computed from the joint distribution of its parts'
    noises, not from each part's own interval: Fieller's set for an average (the
    ``u`` whose ``S − u·N`` is not in the outer ``alpha`` of ``e_S − u·e_N``) and a
    variance's calibrated interval (a quantile of the weighted sum of its three
    noises). Either fails on one event, of probability at most ``alpha``: no split."""
    return alpha


def edges_hold(alpha: float) -> bool:
    """Whether a quantile's interval, chosen at ``EDGES_ALPHA``, may stand for one at
    ``1 − alpha``: a set that holds the truth with probability at least ``1 −
    EDGES_ALPHA`` does so at least ``1 − alpha`` of the time when ``alpha ≥
    EDGES_ALPHA``; at a finer level nothing is known of it."""
    return alpha >= EDGES_ALPHA


EDGE_PARTS = 3
"""A quantile's interval rests on three events: its count's interval and each end's
rank radius (``sql/edges.py``)."""

EDGE_PART_ALPHA = split(EDGES_ALPHA, EDGE_PARTS)
"""The level of each of a quantile interval's three events, ``EDGES_ALPHA/3``: its
ends then hold the quantile together at ``1 − EDGES_ALPHA``."""


def band_level(alpha: float) -> float:
    """The level of a quantile's count's interval and of its rank radius where the band
    of percentiles it may be is judged (``sql/dominance``): the band holds when both
    do, so ``alpha/2`` each."""
    return split(alpha, 2)
