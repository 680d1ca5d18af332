"""What one privacy unit can touch once the SQL has bounded its contribution.

After bounding, one unit adds at most ``rows`` rows to each of at most ``groups``
partitions, out of ``partitions`` released partitions (``sql/ranks.py``
argues that the generated SQL enforces it, for every seed). Every sensitivity in
this package is a function of these three numbers and the neighbouring relation:
under ``add_remove`` a neighbour adds or removes one unit; under ``substitute`` it
replaces one unit's rows by any others within the same bounds (possibly none).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmagic.gate.policy import NEIGHBOURING, Neighbouring


@dataclass(frozen=True)
class Contribution:
    """How much one privacy unit can touch, as enforced by the rewrite."""

    groups: int  # partitions one unit may reach, already capped by the partition count
    rows: int  # rows one unit may add to one partition
    partitions: int  # partitions released

    @classmethod
    def bounded(cls, max_groups: int, max_rows: int, partitions: int) -> Contribution:
        if min(max_groups, max_rows, partitions) < 1:
            raise ValueError("contribution bounds and partition count must be positive")
        return cls(groups=min(max_groups, partitions), rows=max_rows, partitions=partitions)


def checked_relation(neighbouring: Neighbouring) -> Neighbouring:
    """The relation, refused if it is none of the policy's."""
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
    return Neighbouring(neighbouring)
