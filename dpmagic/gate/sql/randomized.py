"""Columns collected by randomized response: what may be asked of them, and how
their answers are debiased.

A column declared ``randomized_response = { p = … }`` holds reported values:
each respondent gave their true value with probability ``p``, else one drawn
uniformly from the column's ``k`` public values. Reported values are pulled
towards the uniform, and a query over them is only useful once that pull is
undone. The gate undoes it where the expectation of a DP measurement is a
known linear function of the truth:

* ``COUNT(*)`` or ``COUNT(column)`` grouped by the column (alone or with other
  public keys): within one group of the other keys, with ``n`` reports of which
  ``c_v`` say ``v``, ``E[c_v] = p·t_v + (1−p)·n/k``, so ``t_v = (c_v − n(1−p)/k)/p``.
* ``SUM(column)`` and ``AVG(column)`` over numeric values: a report's
  expectation is ``p·x + (1−p)·m`` with ``m`` the mean of the public values.

Every other use of the column (in WHERE, a join, an expression, MIN/MAX,
COUNT(DISTINCT), beside other aggregates in a GROUP BY over it) is refused by
:func:`debiasing`, from the query and the policy alone, before data is read.

Debiasing (:func:`debias`) is post-processing of the noisy measurements: it
costs no privacy and the central noise is unchanged (the rule and its proof:
``dpmagic/gate/dp/randomized_response.py``). Its interval is a
*normal approximation*: the randomization's standard deviation (a plug-in
estimate, see the functions below) times the normal quantile, combined in
quadrature with the central noise's own (OpenDP) half-width of the same
linear combination. Quadrature is exact for normal errors and gives the
noise's own interval when the randomization is negligible; for the sum of a normal
and Laplace errors of any relative size it was checked by simulation to cover
at least the nominal 95%. ``tests/unit/test_randomized_response.py`` measures the
coverage of the whole pipeline. Each row's answer is assumed randomized
independently of every other row's, as the survey design declares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import assert_never

import numpy as np
from sqlglot import exp

from dpmagic.gate.dp.randomized_response import random_share, true_count, true_sum
from dpmagic.gate.failures import Refused, required
from dpmagic.gate.policy import Column
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.check import Checked
from dpmagic.gate.sql.trees import unparen

# A noisy measurement's values, one per partition: a list, or the noise pass's array.
Values = Sequence[int | float] | np.ndarray

SUPPORTED = "supported: COUNT(*) or COUNT(column) grouped by it, SUM and AVG of it"


@dataclass(frozen=True)
class Debias:
    """One aggregate over a randomized-response column: what undoes the randomization.

    ``func`` is count (grouped by the column, whose position among the group
    keys is ``key``), sum or avg; ``k`` is the number of public values, and
    ``numbers`` are those values for sums and averages.
    """

    func: AggregateFunc  # COUNT, SUM or AVG
    p: float
    k: int
    key: int | None = None
    numbers: tuple[float, ...] = ()

    @property
    def mean(self) -> float:
        """The expected value of a uniformly random answer."""
        return sum(self.numbers) / self.k

    @property
    def spread(self) -> float:
        """The variance of a uniformly random answer."""
        return sum((v - self.mean) ** 2 for v in self.numbers) / self.k

    @property
    def lo(self) -> float:
        return min(self.numbers)

    @property
    def hi(self) -> float:
        return max(self.numbers)


def debiasing(checked: Checked) -> dict[str, Debias]:
    """The aggregates to debias, by name; refuses every unsupported use of a
    randomized-response column. Reads only the query and the policy."""
    mentioned = _refuse_outside_aggregates_and_keys(checked)
    if not mentioned:
        return {}
    if len(checked.resolved.scans) > 1:
        raise Refused(
            f"{mentioned[0]!r} is collected by randomized response: query its table alone, "
            f"without joins ({SUPPORTED})"
        )
    grouped = [(i, c) for i, k in enumerate(checked.keys) if (c := _bare(k.expr, checked))]
    if len(grouped) > 1:
        raise Refused("GROUP BY one randomized-response column at a time")
    if grouped:
        return _grouped_counts(checked, *grouped[0])
    out = {}
    for agg in checked.aggregates:
        col = _bare(agg.arg, checked) if agg.arg is not None else None
        if col is None:
            continue
        match agg.func:
            case AggregateFunc.COUNT:
                # Whether an answer was given is not randomized: COUNT(column) needs none.
                continue
            case AggregateFunc.SUM | AggregateFunc.AVG:
                pass
            case (
                AggregateFunc.COUNT_DISTINCT
                | AggregateFunc.VAR_SAMP
                | AggregateFunc.VAR_POP
                | AggregateFunc.STDDEV_SAMP
                | AggregateFunc.STDDEV_POP
                | AggregateFunc.QUANTILE
            ):
                raise Refused(f"{agg.label}: {col.name!r} is collected by randomized "
                              f"response; {SUPPORTED}")  # fmt: skip
            case unknown:
                assert_never(unknown)
        values = col.public_values or ()
        if not all(_number(v) for v in values):
            raise Refused(f"{agg.label}: SUM and AVG of a randomized-response column need "
                          "numeric public_values")  # fmt: skip
        numbers = tuple(float(v) for v in values)  # type: ignore[arg-type]
        p = required(col.randomized_response, "a randomized column's probability").p
        out[agg.name] = Debias(agg.func, p, len(values), None, numbers)
    return out


def _grouped_counts(checked: Checked, key: int, col: Column) -> dict[str, Debias]:
    """GROUP BY the column: every aggregate must be a count of rows or of a column."""
    randomized = required(col.randomized_response, "a randomized column's probability")
    for agg in checked.aggregates:
        counted = agg.arg is None or isinstance(unparen(agg.arg), exp.Column)
        if agg.func is not AggregateFunc.COUNT or not counted:
            raise Refused(
                f"{agg.label} beside GROUP BY {col.name} (randomized response): only "
                "COUNT(*) and COUNT(column) are debiased per answer"
            )
    p, k = randomized.p, len(col.public_values or ())
    return {agg.name: Debias(AggregateFunc.COUNT, p, k, key) for agg in checked.aggregates}


def _refuse_outside_aggregates_and_keys(checked: Checked) -> list[str]:
    """Refuse a randomized-response column anywhere but bare in a group key or an
    aggregate's argument; returns the names of those it finds there."""
    resolved = checked.resolved
    places: list[tuple[str, exp.Expression | None]] = [("in WHERE or JOIN … ON", checked.where)]
    places += [("in a join condition", s.on) for s in resolved.scans]
    for j in resolved.semijoins:
        places += [("in IN (SELECT …)", j.lhs), ("in IN (SELECT …)", j.value)]
        places.append(("in IN (SELECT …)", j.where))
    for where, node in places:
        col = _first(node, checked)
        if col is not None:
            raise Refused(f"{col.name!r} is collected by randomized response and cannot be "
                          f"used {where}; {SUPPORTED}")  # fmt: skip
    mentioned = []
    exprs: list[tuple[str, exp.Expression | None]] = [(k.label, k.expr) for k in checked.keys]
    exprs += [(a.label, a.arg) for a in checked.aggregates]
    for label, node in exprs:
        col = _first(node, checked)
        if col is None:
            continue
        if _bare(node, checked) is None:
            raise Refused(f"{label}: {col.name!r} is collected by randomized response and "
                          f"cannot be used inside an expression; {SUPPORTED}")  # fmt: skip
        mentioned.append(col.name)
    return mentioned


def _first(node: exp.Expression | None, checked: Checked) -> Column | None:
    """The first randomized-response column ``node`` reads, if any."""
    if node is None:
        return None
    for n in node.find_all(exp.Column):
        col = checked.resolved.column(n)
        if col is not None and col.randomized_response is not None:
            return col
    return None


def _bare(node: exp.Expression | None, checked: Checked) -> Column | None:
    """The randomized-response column ``node`` is, if it is one and nothing more."""
    if node is None:
        return None
    col = checked.resolved.column(unparen(node))
    return col if col is not None and col.randomized_response is not None else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- Post-processing: estimates and their intervals -------------------------------------


@dataclass(frozen=True)
class Debiased:
    """One debiased aggregate over every partition, and what its interval needs.

    ``random_sd`` is the randomization's standard deviation of each estimate;
    ``gains`` weigh the central noise's half-widths of the aggregate's first and
    second measurement (for counts: the count vector; for sums and averages:
    the sum and the count) in the estimate. ``clip`` bounds every value and
    interval (counts are at least 0, averages within the public values).
    """

    values: list[float]
    random_sd: list[float]
    gains: list[tuple[float, float]]
    clip: tuple[float, float]

    def interval(
        self, pid: int, alpha: float, half_widths: tuple[float, float]
    ) -> tuple[float, float]:
        """A normal-approximation (1-alpha) interval: the randomization's normal
        half-width and the central noise's exact one, added in quadrature."""
        z = NormalDist().inv_cdf(1 - alpha / 2)
        (g1, g2), (h1, h2) = self.gains[pid], half_widths
        noise = math.hypot(g1 * h1, g2 * h2)
        sd = self.random_sd[pid]
        half = math.inf if math.isinf(sd) else math.hypot(z * sd, noise)
        value = self.values[pid]
        lo, hi = self.clip
        return min(max(value - half, lo), hi), min(max(value + half, lo), hi)


def debias(d: Debias, first: Values, second: Values | None, groups: list[list[int]]) -> Debiased:
    """Debias one aggregate from its noisy measurements, one value per partition:
    the count vector (counts), or the sum and count vectors (sums, averages).
    ``groups`` lists, for counts, the partitions that differ only in the
    randomized key: its k reported values within one group of the other keys."""
    match d.func:
        case AggregateFunc.COUNT:
            return _counts(d, first, groups)
        case AggregateFunc.SUM:
            return _sums(d, first, _answers(second))
        case AggregateFunc.AVG:
            return _averages(d, first, _answers(second))
        case (
            AggregateFunc.COUNT_DISTINCT
            | AggregateFunc.VAR_SAMP
            | AggregateFunc.VAR_POP
            | AggregateFunc.STDDEV_SAMP
            | AggregateFunc.STDDEV_POP
            | AggregateFunc.QUANTILE
        ):
            raise ValueError(f"{d.func} is never debiased")
        case unknown:
            assert_never(unknown)


def _answers(counts: Values | None) -> Values:
    """How many answers a debiased sum or mean adds up, which the plan measures with it."""
    if counts is None:
        raise RuntimeError("internal error: the count a debiased sum or mean is over is missing")
    return counts


def _counts(d: Debias, counts: Values, groups: list[list[int]]) -> Debiased:
    """``t_v = (c_v − r·n)/p`` in each group, ``n`` its noisy total, ``r = (1−p)/k``."""
    r = random_share(d.p, d.k)
    own = (1 - r) / d.p  # the weight of c_v's noise in t_v; each other count's is r/p
    gain = math.sqrt(own * own + (d.k - 1) * (r / d.p) ** 2)
    values = [0.0] * len(counts)
    sds = [0.0] * len(counts)
    for group in groups:
        n = max(sum(counts[i] for i in group), 0.0)
        for i in group:
            t = true_count(counts[i], n, d.p, d.k)
            values[i] = t
            sds[i] = math.sqrt(_count_variance(t, n, d.p, r)) / d.p
    return Debiased(values, sds, [(gain, 0.0)] * len(counts), (0.0, math.inf))


def _count_variance(t: float, n: float, p: float, r: float) -> float:
    """The variance of the reported count of a value that ``t`` of ``n`` respondents
    hold: each holder reports it with chance p + r, each other respondent with r."""
    t = min(max(t, 0.0), n)
    return t * (p + r) * (1 - p - r) + (n - t) * r * (1 - r)


def _sums(d: Debias, sums: Values, counts: Values) -> Debiased:
    values, sds, gains = [], [], []
    for s, c in zip(sums, counts, strict=True):
        n = max(c, 0.0)
        total = true_sum(s, c, d.p, d.mean)
        values.append(total)
        sds.append(math.sqrt(_sum_variance(d, total / n if n >= 1 else d.mean, n)) / d.p)
        gains.append((1 / d.p, (1 - d.p) * abs(d.mean) / d.p))
    return Debiased(values, sds, gains, (-math.inf, math.inf))


def _averages(d: Debias, sums: Values, counts: Values) -> Debiased:
    values, sds, gains = [], [], []
    for s, c in zip(sums, counts, strict=True):
        n = max(c, 1.0)
        mean = (s / n - (1 - d.p) * d.mean) / d.p
        values.append(min(max(mean, d.lo), d.hi))
        # With under one noisy answer, nothing is known beyond the public values.
        sd = math.sqrt(_sum_variance(d, mean, n)) / (d.p * n) if c >= 1 else math.inf
        sds.append(sd)
        gains.append((1 / (d.p * n), abs(s) / (d.p * n * n)))
    return Debiased(values, sds, gains, (d.lo, d.hi))


def _sum_variance(d: Debias, mean: float, n: float) -> float:
    """An upper bound on the variance of a sum of ``n`` reports whose true values
    have mean ``mean``.

    A report of true value x has variance p(1−p)(x−m)² + (1−p)s², with m and s²
    the mean and variance of a random answer. The sum of (x−m)² over the true
    values is at most n·((hi−x̄)(x̄−lo) + (x̄−m)²) (the Bhatia–Davis bound on
    their variance given their mean x̄), which is exact for two public values.
    """
    x = min(max(mean, d.lo), d.hi)
    squares = n * ((d.hi - x) * (x - d.lo) + (x - d.mean) ** 2)
    return d.p * (1 - d.p) * squares + n * (1 - d.p) * d.spread
