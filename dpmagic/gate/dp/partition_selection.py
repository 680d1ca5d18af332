"""Rule: how many keys one unit can make appear or vanish, and by how much.

With keys read from the data, a key is released when its noisy count of units
passes a threshold. One unit reaches at most ``groups`` keys (the per-query window
keeps it in at most that many partitions) and adds at most 1 to each key's count
of distinct units: ``l0 = groups``, ``l∞ = 1``. A replacement removes one unit's
keys and adds another's, possibly all different: ``l0 = 2·groups``. The noisy
threshold (``dpmagic/gate/partition_selection.py``) is calibrated to these.
"""

from __future__ import annotations

from dpmagic.gate.dp.contribution import Contribution, checked_relation
from dpmagic.gate.policy import Neighbouring


def key_reach(c: Contribution, neighbouring: Neighbouring) -> tuple[int, int]:
    """``(l0, l∞)``: keys one neighbour can touch, and how much it moves each count."""
    relation = checked_relation(neighbouring)
    return c.groups * (2 if relation == Neighbouring.SUBSTITUTE else 1), 1
