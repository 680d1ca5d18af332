"""What a noisy measurement counts or adds up: decided by the plan, read by every
later pass (the SQL each kind is computed with, its interval, its summary)."""

from __future__ import annotations

from enum import StrEnum


class MeasureKind(StrEnum):
    """What a measurement counts or adds up."""

    COUNT = "count"
    COUNT_DISTINCT = "count_distinct"
    COUNT_UNIT = "count_unit"  # COUNT(DISTINCT unit)
    SUM = "sum"


class Summand(StrEnum):
    """How a sum's SQL reads each row's value: decided once by the plan, read by the
    rewrite (whether to cast and clamp) and by the centring of an average's sum
    (``dp.centred_sums``: whether its count counts exactly the rows it adds)."""

    STORED = "stored"  # a bare declared column within the clamp: read as the load stored it
    TYPED = "typed"  # a bare declared column of the sum's type: clamped, never cast to NULL
    CAST = "cast"  # anything else: cast, where a value the cast cannot read is NULL

    @property
    def counted_exactly(self) -> bool:
        """Whether the value is NULL exactly where the argument is: then a ``COUNT`` of
        the argument counts exactly the rows the sum adds, each within the clamp."""
        return self is not Summand.CAST
