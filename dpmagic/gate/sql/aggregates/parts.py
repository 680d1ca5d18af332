"""What an aggregate is made of, as the plan names it: the measurements each kind of
the catalogue is planned into (``Wanted``, before calibration) and, once planned, their
names by role (``Parts``). Values only, read by every pass after the plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from sqlglot import exp

from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.value_range import ValueRange


class Wanted(NamedTuple):
    """A measurement before calibration."""

    kind: MeasureKind
    arg: exp.Expression | None
    clamp: ValueRange | None
    label: str
    # For a sum measured around its centre, the index in the same list of the count of
    # its rows.
    counted: int | None = None
    # For a sum, the share of each partition's values left out at each end before it is
    # summed (a trimmed sum, ``aggregates.trimmed_mean``); 0: every value.
    trim: float = 0.0


@dataclass(frozen=True)
class Measured:
    """An aggregate that is one noisy value: a count, a distinct count, a plain sum
    (measurement ``name``) or a quantile (selection ``name``)."""

    name: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Avg:
    """``AVG``: the sum ``total`` (centred, or raw when debiased) over ``count``, the
    count of the same rows."""

    total: str
    count: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.total, self.count)


@dataclass(frozen=True)
class DebiasedSum:
    """``SUM`` of a randomized-response column: debiasing reads how many answers
    ``total`` adds up, ``count``."""

    total: str
    count: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.total, self.count)


@dataclass(frozen=True)
class Variance:
    """A variance or standard deviation: from ``count`` and the sums of the values'
    distance to ``centre`` (the middle of their bounds), ``centred``, and of its
    square, ``squares`` (each sum measured around the middle of its own range)."""

    count: str
    centred: str
    squares: str
    centre: float

    @property
    def names(self) -> tuple[str, ...]:
        return (self.count, self.centred, self.squares)


@dataclass(frozen=True)
class Trimmed:
    """``TRIMMED_MEAN``: the sum ``total`` of the values left after trimming (its
    measurement's ``trim``) at each end, each less ``centre``, and ``count``, the count
    of all the values."""

    total: str
    count: str
    centre: float

    @property
    def names(self) -> tuple[str, ...]:
        return (self.total, self.count)


Parts = Measured | Avg | DebiasedSum | Variance | Trimmed
P = TypeVar("P", Measured, Avg, DebiasedSum, Variance, Trimmed)


def narrowed(parts: Parts, role: type[P]) -> P:
    """``parts`` as the ``role`` its kind plans it into; a ValueError (the gate's own bug)
    where the plan made it otherwise."""
    if not isinstance(parts, role):
        raise ValueError(f"{parts} is not {role.__name__}")
    return parts
