"""The interval of every released cell, from the plan and noisy values only (so
post-processing): the one interval arithmetic of released values.

A bare count or sum has its noise's own interval; an average and a variance
calibrated intervals (below); a quantile the interval its two more selections
chose (``edges``), at 95% only; a debiased aggregate its normal approximation
(``randomized``). Each kind says which of these its cells have
(``Aggregate.interval``), computed here. An expression of several has the interval
arithmetic over theirs, each at its share of the level, where every end of the result is a
corner of its arguments' box (``CellIntervals``). Where the arithmetic cannot
bound a cell (a ratio whose denominator's interval reaches 0, a quantile at a
finer level), its interval is unknown. Every level a part is computed at is
decided in ``dp.levels`` (the union bound and its splits), not here. Ranges of row values
before noise (``ValueRange``, from the declared bounds) are ``bound``'s, not
these.

Averages: Fieller's method, below. Variances: ``expected.variance_half_width``.

An average is released as ``centre + S/N``.

``S`` is a noisy centred sum and ``N`` a noisy count of the same rows: ``S = σ +
e_S`` and ``N = ν + e_N`` for the exact ``σ = Σ(v − centre)``, ``ν`` and
independent noises ``e_S``, ``e_N`` whose distributions the plan fixes. For the
exact average ``a = centre + σ/ν``, with ``u = a − centre``,

    ``S − u·N = e_S − u·e_N``

exactly, since ``σ − u·ν = 0``. So for every candidate ``u`` the left side is
computable from the released values and, *if ``u`` is the true one*, has a
known distribution: that of ``e_S − u·e_N``. The set of ``u`` whose value is
not in that distribution's outer ``alpha`` (``P(|e_S − u·e_N| ≥ |S − u·N|) >
alpha``) therefore holds the true ``u`` with probability at least ``1 −
alpha``, at every data set: no approximation of the ratio is made. This is
Fieller's (1954) construction, here with Laplace or Gaussian noise instead of
normal sampling error; it is derived from the plan and the noisy values only,
so it is post-processing.

The box the sum's and the count's own intervals span (each at ``alpha/2``)
holds the answer with probability at least ``1 − alpha`` too, but by a union
bound over two events that are rarely both near their edge: measured at 98.7%
for a 95% level. Fieller's set is the tightest of this kind, at its level.

Two approximations remain, both shown by ``tests/unit/test_intervals.py`` to keep the
coverage within [93%, 97.5%] at a 95% level: the noises are the discrete
Laplace or Gaussian on a fine grid, whose tails are taken to be the
continuous distributions' of the same scale (they differ by about one grid
unit over the scale); and the set is taken to be the interval it is when
``N`` is well above its noise (it is found by bisection outward from the
point estimate). Where ``N`` is not (below twice its own interval's
half-width), or where the two noises are of different kinds, the box is
used instead: wider, never narrower than its level needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from sqlglot import exp

from dpmagic.gate.dp.levels import (
    average_box_level,
    edges_hold,
    expression_level,
    joint_level,
    variance_box_level,
)
from dpmagic.gate.dp.mechanisms import GaussianNoise
from dpmagic.gate.sql.aggregates.debiasing import Debiased
from dpmagic.gate.sql.aggregates.parts import Avg, Measured, Parts, Variance
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.aggregates.variance import Spread, max_variance
from dpmagic.gate.sql.edges import edge_names
from dpmagic.gate.sql.expected import BISECTION_STEPS, variance_half_width
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.noise import Noisy
from dpmagic.gate.sql.plan_types import Measurement, Plan, Selection

Bounds = tuple[float, float]


def laplace_sum_tail(z: np.ndarray, b1: float, b2: np.ndarray) -> np.ndarray:
    """``P(|X + Y| ≥ z)`` for independent Laplace ``X`` of scale ``b1`` and ``Y`` of
    scales ``b2`` (elementwise; ``z`` and ``b2`` of one shape), ``z ≥ 0``: ``(b1²e^(−z/b1)
    − b2²e^(−z/b2)) / (b1² − b2²)``, whose limit ``e^(−z/b)(1 + z/(2b))`` serves where
    the scales (nearly) coincide."""
    b2 = np.maximum(b2, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        e1 = np.exp(-z / b1)
        positive = b2 > 0
        e2 = (
            np.exp(-z / b2)
            if positive.all()
            else np.where(positive, np.exp(-z / np.where(positive, b2, 1.0)), 0.0)
        )
        out = (b1 * b1 * e1 - b2 * b2 * e2) / (b1 * b1 - b2 * b2)
        near = np.abs(b1 - b2) < 1e-6 * b1
        if near.any():  # computed only where it is used: the same values, fewer steps
            mid = (b1 + b2[near]) / 2
            out[near] = np.exp(-z[near] / mid) * (1 + z[near] / (2 * mid))
    return np.clip(out, 0.0, 1.0)


def gaussian_sum_tail(z: np.ndarray, s1: float, s2: np.ndarray) -> np.ndarray:
    """``P(|X + Y| ≥ z)`` for independent centred normals of standard deviations ``s1``
    and ``s2``."""
    sd = np.sqrt(s1 * s1 + s2 * s2)
    return np.vectorize(math.erfc, otypes=[float])(z / (sd * math.sqrt(2)))


def fieller(
    sums: np.ndarray,
    counts: np.ndarray,
    low: float,
    high: float,
    sum_scale: float,
    count_scale: float,
    gaussian: bool,
    alpha: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The ends of the (1 − alpha) Fieller interval for ``u = σ/ν`` in ``[low, high]``,
    one per cell, from noisy centred sums and counts and the noises' scales (Laplace
    scale, or Gaussian σ, in released units). A cell whose set within the bounds is
    empty (the estimate far outside them) gets the bound nearest its estimate."""
    tail = gaussian_sum_tail if gaussian else laplace_sum_tail
    size = len(sums)
    # Both ends at once: the lower end's search in the first half, the upper's in the second.
    s2, n2 = np.concatenate([sums, sums]), np.concatenate([counts, counts])

    def inside(u: np.ndarray) -> np.ndarray:
        return tail(np.abs(s2 - u * n2), sum_scale, np.abs(u) * count_scale) > alpha

    point = np.clip(sums / counts, low, high)
    # Bracket each end: the bound, or nearer, ten standard deviations of the estimate
    # out (never inside the set but at its own bound, which is then the end).
    sd = np.sqrt(2 * (sum_scale**2 + (point * count_scale) ** 2)) / counts
    reach = 10 * sd
    near = np.concatenate([point, point])
    far = np.concatenate([np.maximum(point - reach, low), np.minimum(point + reach, high)])
    far = np.where(inside(far), np.concatenate([np.full(size, low), np.full(size, high)]), far)
    done = inside(far)
    member = inside(near)
    out = far.copy()
    for _ in range(BISECTION_STEPS):
        mid = (near + out) / 2
        ok = inside(mid)
        near = np.where(ok, mid, near)
        out = np.where(ok, out, mid)
    ends = np.where(done, far, out)
    ends = np.where(member, ends, np.concatenate([point, point]))
    return ends[:size], ends[size:]


class CellIntervals:
    """Interval arithmetic over the noise's intervals, for one released cell."""

    def __init__(
        self, plan: Plan, noisy: Noisy, alpha: float, debiased: dict[str, Debiased]
    ) -> None:
        self.plan = plan
        self.noisy = noisy
        self.alpha = alpha
        self.debiased = debiased
        self._mean_cache: dict[tuple[str, float], list[Bounds]] = {}

    def cells(
        self, node: exp.Expression, pids: Sequence[int], parts: int
    ) -> list[list[float] | None] | np.ndarray:
        """The JSON intervals of one output's cells, in ``pids`` order. A bare count or
        sum (most cells of a large GROUP BY) is its measurement's interval, and a bare
        average its cells' intervals as ``means`` computes them all at once, each
        read without walking the expression, as an ``(n, 2)`` array (NaN where JSON
        has null: an end not finite); other expressions are evaluated cell by cell
        (an average's cells that way: about 3.3 µs more each, 66 ms more for 20,000)."""
        found = self.plan.parts.get(node.name) if isinstance(node, exp.Column) else None
        pairs = None
        if found is not None and node.name not in self.debiased:
            pairs = self._bare(node.name, found, pids, expression_level(self.alpha, parts))
        if pairs is None:
            return [json_pair(self.of(node, pid, parts)) for pid in pids]
        pairs[~np.isfinite(pairs).all(axis=1)] = np.nan
        return pairs

    def _bare(
        self, name: str, found: Parts, pids: Sequence[int], level: float
    ) -> np.ndarray | None:
        """The ``(lo, hi)`` rows of a bare average's, count's or sum's cells, all at once,
        as ``means`` and ``measured`` give each; None for any other aggregate."""
        rows = np.asarray(pids, dtype=np.intp)
        if isinstance(found, Avg):
            return np.asarray(self.means(name, found, level), dtype=float).reshape(-1, 2)[rows]
        func = self.plan.checked.aggregate(name).func
        if not isinstance(found, Measured) or not kind_of(func).single:
            return None
        m = self.plan.measurement(found.name)
        half = m.noise.half_width(level) if m.noise.sensitivity else 0.0
        # As ``measured`` computes each cell (a value minus a float is a float), at once.
        value = np.asarray(self.noisy.values[m.name], dtype=float)[rows]
        lo, hi = value - half, value + half
        if m.kind != MeasureKind.SUM:
            lo, hi = np.maximum(lo, 0.0), np.maximum(hi, 0.0)
        return np.column_stack((lo, hi))

    def of(self, node: exp.Expression, pid: int, parts: int) -> Bounds | None:
        return self._eval(node, pid, expression_level(self.alpha, parts))

    def measured(self, m: Measurement, pid: int, alpha: float) -> Bounds:
        value = self.noisy.values[m.name][pid]
        half = m.noise.half_width(alpha) if m.noise.sensitivity else 0.0
        if m.kind != MeasureKind.SUM:
            return max(0.0, value - half), max(0.0, value + half)
        return value - half, value + half

    def _aggregate(self, name: str, pid: int, alpha: float) -> Bounds | None:
        parts = self.plan.parts[name]
        if name in self.debiased:
            ms = [self.plan.measurement(n) for n in parts.names]
            widths = [m.noise.half_width(alpha) if m.noise.sensitivity else 0.0 for m in ms]
            second = widths[1] if len(widths) > 1 else 0.0
            return self.debiased[name].interval(pid, alpha, (widths[0], second))
        kind = kind_of(self.plan.checked.aggregate(name).func)
        return kind.interval(self, name, parts, pid, alpha)

    def edges(self, selection: Selection, pid: int, alpha: float) -> Bounds | None:
        """A quantile's cell: the interval its two more selections chose (``edges``),
        at a level they hold at only; None at any other."""
        if selection.edges is None or not edges_hold(alpha):
            return None
        low, high = edge_names(selection.name)
        return float(self.noisy.values[low][pid]), float(self.noisy.values[high][pid])

    def variance(self, parts: Variance, kind: Spread, pid: int, alpha: float) -> Bounds:
        """A variance's cell: calibrated where that applies, else the box of its parts'."""
        ms = [self.plan.measurement(n) for n in parts.names]
        widest = max_variance(self.plan, parts)
        calibrated = self._calibrated_variance(kind, ms, pid, joint_level(alpha), widest)
        if calibrated is not None:
            return calibrated
        n, s1, s2 = (self.measured(m, pid, variance_box_level(alpha)) for m in ms)
        c1, c2 = ms[1].centre_value, ms[2].centre_value
        return variance_box(kind, n, (c1, s1), (c2, s2), widest=widest)

    def _calibrated_variance(
        self, kind: Spread, ms: list[Measurement], pid: int, alpha: float, widest: float
    ) -> Bounds | None:
        """The calibrated interval of a variance's cell (``expected.variance_half_width``)
        around the released estimate, or None where it does not apply: noises of
        different kinds, or a count not well above its noise (below twice its own
        interval's half-width)."""
        count, total, squares = ms
        if not (type(count.noise) is type(total.noise) is type(squares.noise)):
            return None
        if min(count.scale, total.scale, squares.scale) <= 0 or not count.noise.sensitivity:
            return None
        n = float(self.noisy.values[count.name][pid])
        if n <= max(2 * count.noise.half_width(alpha), 2.0):
            return None
        c1, c2 = total.centre_value, squares.centre_value
        m = c1 + float(self.noisy.values[total.name][pid]) / n
        q = c2 + float(self.noisy.values[squares.name][pid]) / n
        estimate = q - m * m
        m = _within(m, total.bounds.lo, total.bounds.hi)
        q = _within(q, m * m, squares.bounds.hi)
        scales = (count.scale, total.scale, squares.scale)
        gaussian = isinstance(count.noise, GaussianNoise)
        half = variance_half_width(n, m, q, (c1, c2), scales, gaussian, alpha)
        lo, hi = estimate - half, estimate + half
        if kind.sample:
            lo, hi, widest = lo * n / (n - 1), hi * n / (n - 1), widest * n / (n - 1)
        lo, hi = _within(lo, 0.0, widest), _within(hi, 0.0, widest)
        if kind.root:
            return math.sqrt(lo), math.sqrt(hi)
        return lo, hi

    def means(self, name: str, parts: Avg, alpha: float) -> list[Bounds]:
        """The intervals of an average's cells, all computed at once (remembered per
        aggregate and level): Fieller's where it applies, at the whole level, else
        the box of its sum's and its count's intervals (``levels.average_box_level``)."""
        known = self._mean_cache.get((name, alpha))
        if known is not None:
            return known
        total_m, count = self.plan.measurement(parts.total), self.plan.measurement(parts.count)
        lo, hi, centre = total_m.bounds.lo, total_m.bounds.hi, total_m.centre_value
        sums = np.asarray(self.noisy.values[total_m.name], dtype=float)
        counts = np.asarray(self.noisy.values[count.name], dtype=float)
        usable = (
            type(total_m.noise) is type(count.noise)
            and total_m.scale > 0
            and count.scale > 0
            and count.noise.sensitivity > 0
        )
        box = average_box_level(alpha)
        if not usable:
            out = [self._box(total_m, count, pid, box) for pid in range(len(sums))]
        else:
            floor = 2 * count.noise.half_width(alpha)
            ends = fieller(
                sums,
                np.maximum(counts, 1.0),
                lo - centre,
                hi - centre,
                total_m.scale,
                count.scale,
                isinstance(count.noise, GaussianNoise),
                joint_level(alpha),
            )
            out = [
                (centre + float(a), centre + float(b))
                if n > floor
                else self._box(total_m, count, i, box)
                for i, (a, b, n) in enumerate(zip(*ends, counts, strict=True))
            ]
        self._mean_cache[(name, alpha)] = out
        return out

    def _box(self, total_m: Measurement, count: Measurement, pid: int, alpha: float) -> Bounds:
        """Where ``centre + S/N`` lies when the sum and the count lie in their intervals."""
        lo, hi = total_m.bounds.lo, total_m.bounds.hi
        s = self.measured(total_m, pid, alpha)
        c = self.measured(count, pid, alpha)
        if c[0] < 1:
            return lo, hi
        corners = [total_m.centre_value + a / b for a in s for b in c]
        return _within(min(corners), lo, hi), _within(max(corners), lo, hi)

    def _eval(self, node: exp.Expression, pid: int, alpha: float) -> Bounds | None:
        if isinstance(node, exp.Paren):
            return self._eval(node.this, pid, alpha)
        if isinstance(node, exp.Literal) and not node.is_string:
            v = float(node.this)
            return v, v
        if isinstance(node, exp.Column):
            if node.name in self.plan.parts:
                return self._aggregate(node.name, pid, alpha)
            key = next((i for i, k in enumerate(self.plan.keys) if k.name == node.name), None)
            if key is None:
                return None
            value = self.noisy.partitions[pid][key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value), float(value)
        if isinstance(node, exp.Neg):
            a = self._eval(node.this, pid, alpha)
            return None if a is None else (-a[1], -a[0])
        if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
            a = self._eval(node.this, pid, alpha)
            b = self._eval(node.expression, pid, alpha)
            return None if a is None or b is None else _arith(type(node), a, b)
        if isinstance(node, exp.Round | exp.Floor | exp.Ceil | exp.Abs | exp.TryCast | exp.Sqrt):
            a = self._eval(node.this, pid, alpha)
            if a is None:
                return None
            return _unary(node, a)
        return None


def variance_box(
    kind: Spread, n: Bounds, s1: tuple[float, Bounds], s2: tuple[float, Bounds], widest: float
) -> Bounds:
    """Where the variance lies when the count, the sum of the values' distances to the
    middle of the bounds and the sum of their squares lie in their intervals (each
    sum with the centre it is released around); the bounds' own range when the
    count may be too small to say anything."""
    (c1, sum1), (c2, sum2) = s1, s2
    samp = kind.sample
    low_n = 2 if samp else 1
    top = widest * (2 if samp else 1)
    if n[0] < low_n:
        lo, hi = 0.0, top
    else:
        means = [c1 + a / b for a in sum1 for b in n]
        m_lo, m_hi = min(means), max(means)
        sq_lo = 0.0 if m_lo <= 0 <= m_hi else min(m_lo * m_lo, m_hi * m_hi)
        sq_hi = max(m_lo * m_lo, m_hi * m_hi)
        q = [c2 + a / b for a in sum2 for b in n]
        lo, hi = max(min(q) - sq_hi, 0.0), min(max(q) - sq_lo, widest)
        if samp:
            lo, hi = lo * n[1] / (n[1] - 1), hi * n[0] / (n[0] - 1)
        lo, hi = min(max(lo, 0.0), top), min(max(hi, 0.0), top)
    if kind.root:
        return math.sqrt(lo), math.sqrt(hi)
    return lo, hi


def _arith(op: type[exp.Expression], a: Bounds, b: Bounds) -> Bounds | None:
    ops: dict[type[exp.Expression], Callable[[float, float], float]] = {
        exp.Add: lambda x, y: x + y,
        exp.Sub: lambda x, y: x - y,
        exp.Mul: lambda x, y: x * y,
        exp.Div: lambda x, y: x / y,
    }
    if op is exp.Add:
        return a[0] + b[0], a[1] + b[1]
    if op is exp.Sub:
        return a[0] - b[1], a[1] - b[0]
    if op is exp.Div and b[0] <= 0 <= b[1]:
        return None
    corners = [ops[op](x, y) for x in a for y in b]
    return min(corners), max(corners)


def _unary(node: exp.Expression, a: Bounds) -> Bounds:
    if isinstance(node, exp.Round):
        digits = node.args.get("decimals")
        n = int(digits.this) if isinstance(digits, exp.Literal) and digits.is_int else 0
        return round(a[0], n), round(a[1], n)
    if isinstance(node, exp.Floor):
        return float(math.floor(a[0])), float(math.floor(a[1]))
    if isinstance(node, exp.Ceil):
        return float(math.ceil(a[0])), float(math.ceil(a[1]))
    if isinstance(node, exp.Abs):
        low = 0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))
        return low, max(abs(a[0]), abs(a[1]))
    if isinstance(node, exp.Sqrt):
        return math.sqrt(max(a[0], 0.0)), math.sqrt(max(a[1], 0.0))
    return a


def _within(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def json_pair(pair: Bounds | None) -> list[float] | None:
    if pair is None or not (math.isfinite(pair[0]) and math.isfinite(pair[1])):
        return None
    return [pair[0], pair[1]]
