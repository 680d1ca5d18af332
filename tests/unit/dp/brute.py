"""Brute force over everything one privacy unit can contribute after bounding.

A unit, after the SQL has bounded it, has at most ``rows`` values in each of at
most ``groups`` of ``partitions`` partitions, each value in a small set that holds
the bounds. ``units`` enumerates every such unit; the rules' tests compare what a
neighbour (one unit added or removed, or one unit replaced by another) can change
with what each rule claims.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

Unit = tuple[tuple[int, ...], ...]  # per partition, the unit's values there (sorted)


def units(partitions: int, groups: int, rows: int, values: tuple[int, ...]) -> Iterator[Unit]:
    """Every unit: at most ``groups`` non-empty partitions, at most ``rows`` values in
    each (multisets of ``values``); the empty unit too (a substitute may have no row)."""
    cells = [()] + [
        tuple(sorted(c))
        for n in range(1, rows + 1)
        for c in itertools.combinations_with_replacement(values, n)
    ]
    for unit in itertools.product(cells, repeat=partitions):
        if sum(1 for cell in unit if cell) <= groups:
            yield unit


def worst(
    partitions: int, groups: int, rows: int, values: tuple[int, ...], change, project=tuple
) -> tuple:
    """The largest ``change(x, None)`` (adding or removing a unit) and ``change(x, y)``
    (replacing one unit by another) over every unit and pair of units, where ``x`` is
    what ``project`` keeps of a unit (the per-partition sums, say): units alike there
    are searched once."""
    every = sorted({project(u) for u in units(partitions, groups, rows, values)})
    add_remove = max(change(u, None) for u in every)
    substitute = max(change(a, b) for a in every for b in every)
    return add_remove, substitute
