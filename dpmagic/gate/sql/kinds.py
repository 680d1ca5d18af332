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
