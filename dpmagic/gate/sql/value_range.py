"""Where every non-NULL value of a row expression lies: ``[lo, hi]``, from the declared
bounds (``bound``). The one meaning of a range of values in the gate; a 95% interval
of a noisy cell is ``intervals``', never this."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ValueRange:
    """Every non-NULL value of an expression lies in ``[lo, hi]``.

    ``integral`` says the SQL type is an integer (summed exactly) rather than
    a float (summed in fixed point).
    """

    lo: float
    hi: float
    integral: bool

    def hull(self, other: ValueRange) -> ValueRange:
        return ValueRange(
            min(self.lo, other.lo), max(self.hi, other.hi), self.integral and other.integral
        )

    @property
    def finite(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


BOOL = ValueRange(0, 1, True)
UNBOUNDED = ValueRange(-math.inf, math.inf, False)
