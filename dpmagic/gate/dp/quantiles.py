"""Rule: how many values one unit moves in the multisets a quantile is chosen from.

The exponential mechanism scores each candidate by how far its rank is from the
asked one in the multiset of (snapped) values, over all partitions; each score
moves by at most the number of values added or removed. A unit brings at most
``rows`` values to each of at most ``groups`` partitions: ``groups·rows`` values
added or removed. A replacement cannot cancel (the old unit's values leave, the
new one's arrive, possibly in other places): twice that.
"""

from __future__ import annotations

from dpmagic.gate.dp.contribution import Contribution, checked_relation
from dpmagic.gate.policy import Neighbouring


def selection_distance(c: Contribution, neighbouring: Neighbouring) -> int:
    """Values one unit can add or remove over all partitions (symmetric difference)."""
    reach = c.groups * c.rows
    return reach if checked_relation(neighbouring) == Neighbouring.ADD_REMOVE else 2 * reach
