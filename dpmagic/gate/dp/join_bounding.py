"""Rule: a join of one unit's private rows keeps at most ``K`` joined rows.

A join may multiply a unit's rows (its ``a`` rows in one table joined to its ``b``
rows in another give up to ``a·b``), so a rank filter on each scan is not enough
by itself. For a join of private scans over tables ``T_1 … T_m`` (``resolve`` has
proven that every joined row's private rows belong to one unit, the row's unit),
with ``n_i`` the rows the unit kept in ``T_i`` at load (stored on each of its rows,
a function of its own rows), scan ``i`` keeps the unit's ranks ``≤ room_i``, where

    room_i = K // p_(i−1),   p_0 = 1,   p_i = p_(i−1) · max(1, min(n_i, room_i)).

Proof. ``p_i`` is the same on every row of one unit, at least 1 and at most ``K``
(``p_i ≤ p_(i−1) · room_i ≤ K`` when ``min(n_i, room_i) ≥ 1``, and ``p_i =
p_(i−1)`` otherwise). A unit's joined rows after scan ``i`` number at most
``p_i``: each row before it is completed by at most ``min(n_i, room_i)`` matches
(the ranks kept, and the rows it has in ``T_i``), or by one NULL in a ``LEFT
JOIN``. So a unit keeps at most ``p_m ≤ K`` joined rows, chosen from its own rows
and the seed alone: the table the aggregate reads is still a 1-stable function of
the data in units, with ``K`` rows per unit, seed by seed, and the sensitivities
of ``sums`` and ``counts`` hold with ``rows = K``. When a unit's rows multiply to
at most ``K`` nothing of it is dropped; beyond, the earlier tables keep more rows
and the later ones fewer.

Keyed scans. A scan is *keyed* when the join holds an equality of its table's unique
key with a column of another scan that is itself unkeyed or keyed (``sql/keyed.py``
decides it: a ``WHERE`` conjunct, or a conjunct of the scan's own ``LEFT JOIN``
condition; the key a declared link names, whose uniqueness the gate checks at start),
every keyed scan reaching an unkeyed one through such equalities. A keyed scan keeps
the unit's ranks ``≤ K`` and leaves the product unchanged: ``p_i = p_(i−1)``.

Proof. Follow each keyed scan's equality to its partner, and the partner's, down to
an unkeyed scan. A joined row's keyed parts are then functions of its unkeyed parts:
the one row (if any) whose unique key equals its partner's value, or one NULL in a
``LEFT JOIN``. So the joined rows number at most the rows of the join of the
unkeyed scans alone, at most the product of their factors, ``≤ K`` as above. A line
joined to its order and its customer is one row, however many orders the customer
has, where the product would have counted orders × lines. The work of a join the
engine orders otherwise (a keyed scan joined on the unit alone, before its partner)
is bounded by its room, ``K`` rows, in ``sql/work.py``.
"""

from __future__ import annotations

from collections.abc import Sequence


def rooms(k: int, counts: Sequence[int], keyed: Sequence[bool] = ()) -> list[int]:
    """The ranks each scan keeps of a unit with ``counts[i]`` rows in the ``i``-th
    joined table, ``keyed[i]`` where the scan is keyed (``sql/ranks.room_reads``
    computes the same in SQL)."""
    flags = list(keyed) or [False] * len(counts)
    out, product = [], 1
    for n, key in zip(counts, flags, strict=True):
        if key:
            out.append(k)
            continue
        room = k // product
        out.append(room)
        product *= max(1, min(n, room))
    return out


def joined_rows_bound(k: int, counts: Sequence[int], keyed: Sequence[bool] = ()) -> int:
    """``p_m``: the most joined rows the unit can keep, at most ``k``: the product of
    the unkeyed scans' factors (a keyed scan completes each row once at most)."""
    flags = list(keyed) or [False] * len(counts)
    product = 1
    for n, room, key in zip(counts, rooms(k, counts, flags), flags, strict=True):
        if not key:
            product *= max(1, min(n, room))
    return product
