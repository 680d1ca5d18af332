"""Rule: what each way the SQL bounds a unit lets it contribute (a ``Contribution``).

``sql/ranks.py`` decides how a query bounds each unit's rows and argues that its SQL
enforces that bound, for every seed; the contribution each bound gives, which every
sensitivity of the plan reads, is decided here.

- **Row level** (no privacy unit): each row is its own unit, one row in one partition:
  ``(groups, rows) = (1, 1)``.
- **Window** (per query, after the joins): at most ``rows`` rows in each of at most
  ``groups`` partitions: ``(groups, rows)``, the contribution's own definition.
- **Ranks** (at load): at most ``K`` rows, in any partitions: ``(1, K)``, as if all in one.

Proof for the ranks. Let a unit's ``K`` rows lie ``k_i`` in partition ``i``
(``Σ k_i ≤ K``), each value in ``[lo, hi]``. Adding or removing it moves cell ``i`` by at
most ``k_i·reach`` (``reach = max(|lo|, |hi|)``): ``K·reach`` in L1, and in squared L2
``Σ (k_i·reach)² ≤ (K·reach)²``, both attained with all ``K`` in one cell; that is
``dp/sums`` for one group of ``K`` rows. Replacing it by another such unit moves each cell
by at most ``k_i·reach + k'_i·reach``, and a cell both reach by at most
``max(k_i, k'_i)·width`` (``width = max(hi, 0) − min(lo, 0) ≤ 2·reach``): in L1 at most
``2K·reach``, or ``K·width`` if there is one partition; in squared L2 a sum of squares
of the cells' changes, whose total is bounded as in L1 and which is largest when the
changes are gathered in as few cells as the bounds allow: ``K·width`` in one cell, or
``K·reach`` in each of two. Those are ``dp/sums``'s bounds for ``groups = 1``, ``rows = K``
over ``partitions`` (its shared cells ``s ∈ {max(0, 2 − partitions), 1}``). Spreading
the rows over more partitions only lowers the squares. Counts are sums of ones. This
bounds sums, not the partitions a unit reaches: ``K`` rows may lie in ``K`` partitions,
so a count of distinct units needs the window (``dp/counts.distinct_units``).

``tests/unit/dp/test_production.py`` checks each map against a brute force over every
unit each bound leaves (sums, counts, L1 and squared L2, both relations): equal, so a
map that claims one row or one group less (or more) is caught.
"""

from __future__ import annotations

from dpmagic.gate.dp.contribution import Contribution


def row_level(partitions: int) -> Contribution:
    """Each row its own unit: one row in one partition."""
    return Contribution.bounded(1, 1, partitions)


def ranked(rows: int, partitions: int) -> Contribution:
    """The load-time ranks keep at most ``rows`` rows of a unit, in any partitions: the
    contribution of ``rows`` rows in one (the proof above)."""
    return Contribution.bounded(1, rows, partitions)


def window(groups: int, rows: int, partitions: int) -> Contribution:
    """The per-query window keeps at most ``rows`` rows of a unit in each of at most
    ``groups`` partitions."""
    return Contribution.bounded(groups, rows, partitions)
