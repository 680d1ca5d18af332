"""Pass 9: post-processing on noisy values only.

The noisy vectors and the public keys are loaded into an empty in-memory
DuckDB and the query's ``SELECT`` list, ``HAVING``, ``ORDER BY`` and
``LIMIT`` are evaluated there, each DP aggregate replaced by its noisy value:
a count floored at zero, a sum as is, an average as noisy sum over noisy
count clamped into the value's bounds. Whatever this computes is
post-processing of DP outputs and costs no privacy.

Each released cell carries a 95% interval: the noise's own interval for a
single count or sum, calibrated intervals for an average (Fieller's) and a
variance (``intervals``), and interval arithmetic over the aggregates'
intervals (Bonferroni-adjusted) for expressions of several. A quantile's interval
is made of two more selections (``edges``), at 95% only: under arithmetic that
needs it at a finer level its interval is unknown. It carries its rank radius
and its band of the group's percentiles too (``QuantileNoise.rank_radius``).

Aggregates over a randomized-response column are debiased first
(``randomized``): their values and their normal-approximation intervals,
which combine the randomization with the central noise, stand in for the raw
measurements'. Debiasing reads noisy values only, so it too is
post-processing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from sqlglot import exp

from dpmagic import wire
from dpmagic.gate.dp.calibration import REPORT_ALPHA
from dpmagic.gate.dp.mechanisms import GaussianNoise
from dpmagic.gate.engines.dialect import DUCKDB
from dpmagic.gate.sql.check import Checked
from dpmagic.gate.sql.dominance import (
    count_stretch,
    expected_width,
    percentile_band,
    range_rule,
    signed_rule,
    verdicts,
    zero_rule,
)
from dpmagic.gate.sql.edges import edge_names
from dpmagic.gate.sql.expected import average_error, variance_error
from dpmagic.gate.sql.intervals import fieller, variance_half_width
from dpmagic.gate.sql.kinds import MeasureKind
from dpmagic.gate.sql.noise import Noisy, Partition, declared_array
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan import Avg, DebiasedSum, Measured, Measurement, Plan, Selection, Variance
from dpmagic.gate.sql.randomized import Debiased, debias
from dpmagic.gate.sql.totality import generated
from dpmagic.gate.sql.trees import unparen

ALPHA = REPORT_ALPHA
PID = "__pid"
# An empty in-memory database that only ever sees noisy values; each release
# works in a connection of its own, whose registered table dies with it.
_POST_DB = duckdb.connect(config={"enable_external_access": False, "threads": 1})

Bounds = tuple[float, float]
# The noisy table, by column: lists, or numpy arrays where the noise pass made them.
Columns = dict[str, Sequence[object]]


@dataclass(frozen=True, eq=False)
class Released:
    """The released table: its values column by column, as JSON would carry them (numpy
    arrays where the noise pass made them, non-finite floats only in those), and its
    accuracy, whose per-cell intervals may be an ``(n, 2)`` array (NaN where JSON has
    null): ``dpmagic/wire.py`` writes either without a Python object per cell."""

    columns: list[str]
    values: wire.Columns
    cells_accuracy: dict[str, object]

    @property
    def rows(self) -> list[list[object]]:
        """The rows as the JSON reply carries them."""
        return self.values.rows

    @property
    def accuracy(self) -> dict[str, object]:
        """The accuracy as the JSON reply carries it (arrays as lists)."""
        reply = {"columns": self.columns, "rows": [], "accuracy": self.cells_accuracy}
        envelope, table = wire.split({**reply, "rows": self.values})
        return wire.merged(envelope, table)["accuracy"]

    def __eq__(self, other: object) -> bool:
        """Equal when the JSON replies are: the same columns, rows and accuracy."""
        if not isinstance(other, Released):
            return NotImplemented
        mine = (self.columns, self.rows, self.accuracy)
        return mine == (other.columns, other.rows, other.accuracy)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class PostQuery:
    """The query's SELECT list (the partition id first), HAVING and ORDER BY over the
    noisy table: trees made from the plan alone, so once per analysis (``pipeline
    .generate``), not once per answer (0.1–0.4 ms of sqlglot copies each time)."""

    exprs: tuple[exp.Expression, ...]
    having: exp.Expression | None
    order: tuple[exp.Expression, ...]


def post_query(plan: Plan) -> PostQuery:
    post = _PostExpr(plan, plan.checked)
    checked = plan.checked
    return PostQuery(
        exprs=(_col(PID), *(post.tree(o.expr) for o in checked.outputs)),
        having=None if checked.having is None else post.tree(checked.having),
        order=tuple(post.tree(o) for o in checked.order),
    )


def release(noisy: Noisy, alpha: float = ALPHA, made: PostQuery | None = None) -> Released:
    """The released table and its accuracy; ``made`` is the plan's ``post_query``
    when the caller kept it."""
    plan = noisy.plan
    checked = plan.checked
    debiased = _debiased(plan, noisy)
    table = _noisy_columns(plan, noisy, debiased)
    post = _PostExpr(plan, checked)
    made = made or post_query(plan)
    exprs = list(made.exprs)
    names = [PID, *(o.name for o in checked.outputs)]
    plain = checked.having is None and not checked.order and checked.limit is checked.offset is None
    vectors = _direct(table, exprs) if plain else None
    if vectors is None:
        query = exp.select(
            *(exp.alias_(e.copy(), n, quoted=True) for e, n in zip(exprs, names, strict=True))
        ).from_("noisy")
        if made.having is not None:
            query = query.where(made.having.copy())
        if made.order:
            query = query.order_by(*(o.copy() for o in made.order))
        if checked.limit is not None:
            query = query.limit(checked.limit)
        if checked.offset is not None:
            query = query.offset(checked.offset)
        con = _POST_DB.cursor()
        try:
            con.register("noisy", pd.DataFrame(table))
            result = con.execute(DUCKDB.render(query)).fetchall()
        finally:
            con.close()
        vectors = list(zip(*result, strict=True)) if result else [() for _ in names]
    pids = vectors[0]

    intervals = _Intervals(plan, noisy, alpha, debiased)
    accuracy_columns: list[dict[str, object] | None] = []
    for out in checked.outputs:
        used = post.measurements_in(out.expr)
        if not used:
            accuracy_columns.append(None)
            continue
        parts = [_part(plan, n) for n in used]
        single = parts[0] if len(parts) == 1 else None
        bare = isinstance(out.expr, exp.Column) and isinstance(single, Selection)
        rank = _rank_accuracy(single, alpha) if bare else {}
        events = post.estimates_in(out.expr)
        pairs = intervals.cells(out.expr, pids, events)
        accuracy_columns.append(
            {
                **rank,
                "mechanism": single.noise.mechanism if single else "post-processing",
                "scale": single.scale if single else None,
                **_randomized_accuracy(plan, out.expr),
                "measurements": [p.label for p in parts],
                "intervals": pairs,
                **_judged(plan, noisy, alpha / events, out.expr, pids, pairs),
            }
        )
    accuracy: dict[str, object] = {"alpha": alpha, "columns": accuracy_columns}
    if plan.key_selection is not None:
        # Which keys appear is itself a DP output: say how they were chosen.
        accuracy["partition_selection"] = plan.key_selection.as_dict()
    return Released(
        columns=[o.name for o in checked.outputs],
        values=wire.Columns([_json_column(v) for v in vectors[1:]]),
        cells_accuracy=accuracy,
    )


def _direct(table: Columns, exprs: list[exp.Expression]) -> list[Sequence[object]] | None:
    """What DuckDB returns for ``SELECT exprs FROM table`` when every expression is a
    bare column, a column floored at zero or an average (keys, counts, sums,
    quantiles, averages: most queries), computed here from the same columns, column
    by column; None for anything else. Registering the table in DuckDB and running
    the query costs 1.2–3 ms, and building the pandas frame DuckDB reads another
    0.5 ms, as much as the rest of the release pass. A numpy column (the noise pass's,
    ``noise.columnar``) stays one: 100,000 cells in microseconds, not a list's
    milliseconds."""
    columns: list[Sequence[object]] = []
    for e in exprs:
        mean = _mean(e)
        if mean is not None:
            values = _mean_values(table, *mean)
            if values is None:
                return None
            columns.append(values)
            continue
        floored = _floored(e)
        column = floored if floored is not None else e
        if not isinstance(column, exp.Column) or column.name not in table:
            return None
        values = table[column.name]
        if isinstance(values, np.ndarray):
            array = _array_column(values, floored is not None)
            if array is None:
                return None
            columns.append(array)
            continue
        kind = _kind(values)
        if kind is None:
            return None
        if floored is not None:
            if kind not in "if":
                return None
            zero = 0.0 if kind == "f" else 0
            values = [max(v, zero) for v in values]
        columns.append(values)
    return columns


def _array_column(values: np.ndarray, floored: bool) -> np.ndarray | None:
    """A numpy column as DuckDB would return it: integers as they are (floored at 0 as
    ``max(v, 0)`` floors them), finite floats unfloored; None for anything else."""
    if values.dtype.kind == "i":
        return np.where(values < 0, 0, values) if floored else values
    if values.dtype.kind == "f" and not floored and np.isfinite(values).all():
        return values
    return None


Mean = tuple[float, str, str, float, float]  # centre, total, count, lo, hi


def _mean(e: exp.Expression) -> Mean | None:
    """The parts of an average as ``_PostExpr`` releases it, ``LEAST(GREATEST(centre
    + (total / NULLIF(GREATEST(count, 1), 0)), lo), hi)`` with the three numbers as
    DOUBLE literals; None for any other tree."""
    if not (isinstance(e, exp.Least) and len(e.expressions) == 1):
        return None
    low, hi = e.this, _double(e.expressions[0])
    if not (isinstance(low, exp.Greatest) and len(low.expressions) == 1):
        return None
    lo, value = _double(low.expressions[0]), low.this
    if not isinstance(value, exp.Add):
        return None
    centre, share = _double(value.this), unparen(value.expression)
    if not isinstance(share, exp.Div):
        return None
    count = share.expression
    if isinstance(count, exp.Nullif) and count.expression == exp.Literal.number(0):
        count = count.this  # NULLIF(GREATEST(n, 1), 0): never 0, the same value
    if not (
        isinstance(share.this, exp.Column)
        and isinstance(count, exp.Greatest)
        and isinstance(count.this, exp.Column)
        and len(count.expressions) == 1
        and count.expressions[0] == exp.Literal.number(1)
    ):
        return None
    if centre is None or lo is None or hi is None:
        return None
    return centre, share.this.name, count.this.name, lo, hi


def _double(e: exp.Expression) -> float | None:
    """The value of ``_literal``'s ``CAST('…' AS DOUBLE)``; None for anything else."""
    if (
        isinstance(e, exp.Cast)
        and e.to.this == exp.DataType.Type.DOUBLE
        and isinstance(e.this, exp.Literal)
        and e.this.is_string
    ):
        return float(e.this.this)
    return None


def _mean_values(
    table: Columns, centre: float, total: str, count: str, lo: float, hi: float
) -> list[object] | None:
    """The average per row as DuckDB computes it: both columns as DOUBLE, divided,
    added to the centre, then clamped into ``[lo, hi]``."""
    if total not in table or count not in table:
        return None
    sums, counts = table[total], table[count]
    if isinstance(sums, np.ndarray) or isinstance(counts, np.ndarray):
        return _mean_array(sums, counts, centre, lo, hi)
    if (_kind(sums) or "O") not in "if" or _kind(counts) != "i":
        return None
    out = []
    for t, n in zip(table[total], table[count], strict=True):
        value = centre + float(t) / float(max(n, 1))
        if not math.isfinite(value):
            return None
        out.append(min(max(value, lo), hi))
    return out


def _mean_array(
    sums: Sequence[object], counts: Sequence[object], centre: float, lo: float, hi: float
) -> np.ndarray | None:
    """``_mean_values`` over numpy columns, the same operations in the same order on the
    same doubles: ``centre + t / max(n, 1)``, then ``min(max(·, lo), hi)`` as Python's
    ``max`` and ``min`` pick (the first argument on a tie)."""
    t, n = np.asarray(sums), np.asarray(counts)
    if t.dtype.kind not in "if" or n.dtype.kind != "i":
        return None
    value = centre + t.astype(float) / np.where(n < 1, 1, n).astype(float)
    if not np.isfinite(value).all():
        return None
    value = np.where(lo > value, lo, value)
    return np.where(hi < value, hi, value)


def _floored(e: exp.Expression) -> exp.Column | None:
    """The column of ``GREATEST(column, 0)``, the form a count is released in."""
    if (
        isinstance(e, exp.Greatest)
        and isinstance(e.this, exp.Column)
        and len(e.expressions) == 1
        and e.expressions[0] == exp.Literal.number(0)
    ):
        return e.this
    return None


def _kind(values: list[object]) -> str | None:
    """The kind of a column whose values DuckDB would return as they are (as numpy
    names them: ``i`` integers, ``f`` finite floats, ``b`` booleans, ``O`` strings);
    None for anything else, which goes through DuckDB. Integers beyond 128 bits,
    which DuckDB cannot read, are returned as they are. An empty column releases
    no row, whatever its kind."""
    if not values:
        return "i"
    types = set(map(type, values))
    if len(types) != 1:
        return None
    (first,) = types
    if first is float:
        return "f" if np.isfinite(np.asarray(values, dtype=float)).all() else None
    return {int: "i", bool: "b", str: "O"}.get(first)


Rule = tuple[str, object]
"""How noise dominance is judged (``dominance``): ``("range", (lo, hi, count, floor))``
(the count of the value's group, or None; ``floor`` an average's or variance's
``(error, parts, square_root)``, ``expected``, or None under scaling),
``("percentiles", selection)`` or ``("zero", (measurement, sign))`` for a bare count
or sum (``("zero", None)`` otherwise)."""


def judging_rule(plan: Plan, node: exp.Expression) -> Rule:
    """The rule a released expression is judged by: a value with a declared range (an
    average, a variance, a standard deviation, or one of them rounded, cast or scaled
    by a constant) by its range, a bare quantile (or one rounded, cast or scaled by a
    positive constant) by its percentiles, anything else by the zero rule (a bare
    count or sum with its measurement, judged on its noise's own interval)."""
    if isinstance(node, exp.Paren | exp.Round | exp.Floor | exp.Ceil | exp.TryCast):
        inner = judging_rule(plan, node.this)
        return inner if inner[0] != "zero" else ("zero", None)
    if isinstance(node, exp.Mul | exp.Div):
        factor, other = _constant(node.expression), node.this
        if factor is None and isinstance(node, exp.Mul):
            factor, other = _constant(node.this), node.expression
        if not factor:
            return "zero", None
        factor = 1 / factor if isinstance(node, exp.Div) else factor
        kind, what = judging_rule(plan, other)
        if kind == "range":
            lo, hi, count, _ = what  # type: ignore[misc]
            return "range", (*sorted((lo * factor, hi * factor)), count, None)
        if kind == "percentiles" and factor > 0:
            return kind, what
        return "zero", None
    if not (isinstance(node, exp.Column) and node.name in plan.parts):
        return "zero", None
    parts = plan.parts[node.name]
    func = plan.checked.aggregate(node.name).func
    if func == "quantile":
        return "percentiles", plan.selection(parts.names[0])
    if isinstance(parts, Avg):
        total, count = plan.measurement(parts.total), plan.measurement(parts.count)
        floor = None if node.name in plan.debiased else (average_error, parts, False)
        return "range", (total.bounds.lo, total.bounds.hi, count, floor)
    if isinstance(parts, Variance):
        widest = _max_variance(plan, parts)
        root = func.startswith("stddev")
        high = math.sqrt(widest) if root else widest
        return "range", (0.0, high, plan.measurement(parts.count), (variance_error, parts, root))
    if isinstance(parts, Measured) and node.name not in plan.debiased:
        m = plan.measurement(parts.name)
        sign = 1 if m.clamp is None or m.clamp.lo >= 0 else -1 if m.clamp.hi <= 0 else 0
        return "zero", (m, sign)
    return "zero", None


def _constant(node: exp.Expression) -> float | None:
    node = unparen(node)
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
    return None


def _judged(
    plan: Plan,
    noisy: Noisy,
    alpha: float,
    node: exp.Expression,
    pids: list[int],
    pairs: list[list[float] | None],
) -> dict[str, object]:
    """The rule a column is judged by and, per cell, whether noise dominates it
    (``dominance``; ``None`` where the gate cannot tell); a quantile's band of
    percentiles too. From the plan and the noisy values only."""
    kind, what = judging_rule(plan, node)
    if kind == "percentiles":
        return _judged_quantile(plan, noisy, alpha, what, pids)  # type: ignore[arg-type]
    index = np.asarray(pids, dtype=np.intp)
    if kind == "zero" and what is not None:
        # A bare count or sum: its noise's own interval, before a count's floor at 0
        # (a noisy count of -8 is released as 0 [0, 0], and is noise).
        m, sign = what  # type: ignore[misc]
        half = m.noise.half_width(alpha) if m.noise.sensitivity else 0.0
        value = np.asarray(noisy.values[m.name], dtype=float)[index]
        flags = signed_rule(value, half, sign)
        return {"rule": "zero", "noise_dominates": verdicts(flags, ~np.isfinite(value))}
    ends = np.array([p if p is not None else (np.nan, np.nan) for p in pairs], dtype=float)
    ends = ends.reshape(len(pairs), 2)
    lo, hi = ends[:, 0], ends[:, 1]
    unknown = np.isnan(lo) | np.isnan(hi)
    if kind == "range":
        low, high, count, floor = what  # type: ignore[misc]
        stretch = least = None
        if count is not None:
            half = count.noise.half_width(alpha) if count.noise.sensitivity else 0.0
            counts = np.asarray(noisy.values[count.name], dtype=float)[index]
            stretch, least = count_stretch(counts, half), counts - half
        widths = None
        if floor is not None and least is not None:
            error, parts, root = floor
            widths = expected_width(error(plan, parts, alpha), least, lo, hi, root)
        flags = range_rule(lo, hi, low, high, stretch, widths)
        return {"rule": "range", "range": [low, high], "noise_dominates": verdicts(flags, unknown)}
    return {"rule": "zero", "noise_dominates": verdicts(zero_rule(lo, hi), unknown)}


def _judged_quantile(
    plan: Plan, noisy: Noisy, alpha: float, selection: Selection, pids: list[int]
) -> dict[str, object]:
    """A quantile's band of the group's percentiles and verdict, from a noisy count of
    the values it was chosen from (the rank radius and the count's interval at
    ``alpha/2`` each, so the band holds at ``1 − alpha``); ``None`` without one."""
    count = quantile_count(plan, selection)
    if count is None:
        unknown = [None] * len(pids)
        return {"rule": "percentiles", "count": None, "percentiles": unknown,
                "noise_dominates": list(unknown)}  # fmt: skip
    half = count.noise.half_width(alpha / 2) if count.noise.sensitivity else 0.0
    counts = np.asarray(noisy.values[count.name], dtype=float)[np.asarray(pids, dtype=np.intp)]
    radius = selection.noise.rank_radius(alpha / 2)
    a, b, flags = percentile_band(selection.noise.level, radius, counts - half)
    return {
        "rule": "percentiles",
        "count": count.label,
        "percentiles": np.column_stack((a, b)).tolist(),
        "noise_dominates": verdicts(flags),
    }


def quantile_count(plan: Plan, selection: Selection) -> Measurement | None:
    """The query's noisy count of exactly the values ``selection`` is chosen from: a
    ``COUNT`` of the same argument (its own, or the count of an average or variance
    of it), in the same groups. ``COUNT(*)`` does not do: it counts rows whose
    argument is NULL, and a count too high makes the band too narrow."""
    arg = selection.arg.sql(dialect=DIALECT)
    for m in plan.measurements:
        if m.kind == MeasureKind.COUNT and m.arg is not None and m.arg.sql(dialect=DIALECT) == arg:
            return m
    return None


def _rank_accuracy(selection: Selection, alpha: float) -> dict[str, float]:
    """The quantile level and its rank radius: public, from the plan alone."""
    return {
        "level": selection.noise.level,
        "rank_radius": selection.noise.rank_radius(alpha),
    }


def _randomized_accuracy(plan: Plan, node: exp.Expression) -> dict[str, object]:
    """A bare debiased aggregate names both its sources of error, and how its
    interval is made."""
    d = plan.debiased.get(node.name) if isinstance(node, exp.Column) else None
    if d is None:
        return {}
    first = plan.measurement(plan.parts[node.name].names[0])  # the count, sum or mean's sum
    return {
        "mechanism": f"randomized response + {first.noise.mechanism}",
        "scale": first.scale,
        "randomized_response": {"p": d.p, "values": d.k},
        "interval": "normal approximation",
    }


def _debiased(plan: Plan, noisy: Noisy) -> dict[str, Debiased]:
    """Each randomized-response aggregate debiased from its noisy measurements."""
    out = {}
    for name, d in plan.debiased.items():
        parts = plan.parts[name]
        groups = _groups_over(noisy.partitions, d.key) if d.key is not None else []
        if isinstance(parts, Avg | DebiasedSum):
            out[name] = debias(d, noisy.values[parts.total], noisy.values[parts.count], groups)
        elif isinstance(parts, Measured):
            out[name] = debias(d, noisy.values[parts.name], None, groups)
    return out


def _groups_over(partitions: tuple[Partition, ...], key: int) -> list[list[int]]:
    """Partitions grouped by every key but ``key``: each group holds one partition
    per value of ``key``, as the partitions are every combination of public keys
    (the plan refuses such a key beside keys chosen from the data)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for pid, partition in enumerate(partitions):
        groups.setdefault(partition[:key] + partition[key + 1 :], []).append(pid)
    return list(groups.values())


def _part(plan: Plan, name: str) -> Measurement | Selection:
    if name.startswith("q"):
        return plan.selection(name)
    return plan.measurement(name)


def _noisy_columns(plan: Plan, noisy: Noisy, debiased: dict[str, Debiased]) -> Columns:
    """The noisy table, column by column: the partition ids, the keys, the noisy
    measurements and the debiased aggregates."""
    data: Columns = {PID: np.arange(len(noisy.partitions))}
    for i, key in enumerate(plan.keys):
        data[key.name] = _key_column(plan, noisy, i)
    for m in (*plan.measurements, *plan.selections):
        values = noisy.values[m.name]
        data[f"__{m.name}"] = values if isinstance(values, np.ndarray) else list(values)
    for name, d in debiased.items():
        data[_debiased_column(name)] = list(d.values)
    return data


def _key_column(plan: Plan, noisy: Noisy, i: int) -> Sequence[object]:
    """Key ``i``'s value per partition: one integer key's declared values as the int64
    array the noise pass matched rows with (made once per plan, ``declared_array``),
    anything else as a list of the partitions' values."""
    if len(plan.keys) == 1 and noisy.partitions is plan.partitions:
        declared = declared_array(plan)
        if declared is not None and declared.type == pa.int64():
            return declared.to_numpy()
    return [p[i] for p in noisy.partitions]


def _debiased_column(name: str) -> str:
    return f"{name}_debiased"


class _PostExpr:
    """Rewrites released expressions over the noisy table."""

    def __init__(self, plan: Plan, checked: Checked) -> None:
        self.plan = plan
        self.checked = checked

    def measurements_in(self, node: exp.Expression) -> list[str]:
        names: list[str] = []
        for n in node.walk():
            if isinstance(n, exp.Column) and n.name in self.plan.parts:
                for name in self.plan.parts[n.name].names:
                    if name not in names:
                        names.append(name)
        return names

    def estimates_in(self, node: exp.Expression) -> int:
        """How many estimates with intervals of their own ``node`` combines (for the
        Bonferroni split): one per debiased aggregate, average and variance (each has
        an interval of its own at the level it is given), one per other measurement."""
        names = {n.name for n in node.walk() if isinstance(n, exp.Column)}
        whole = {n for n in names if n in self.plan.debiased or _is_whole(self.plan, n)}
        others = {
            m for n in names - whole if n in self.plan.parts for m in self.plan.parts[n].names
        }
        return len(whole) + len(others)

    def tree(self, node: exp.Expression) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and n.name in self.plan.parts:
                return self._aggregate(n.name)
            return n

        # Post-processing cannot raise either: an error would cost the user the ε
        # already charged for an answer they never see. An aggregate or key alone is a
        # column (or a total function of columns); anything computed from them is
        # evaluated under ``TRY``, where a failure is a NULL cell.
        out = generated(node.copy().transform(swap))
        target = out.this if isinstance(out, exp.Ordered) else out
        plain = node.this if isinstance(node, exp.Ordered) else node
        if not isinstance(plain, exp.Column):
            target = exp.Try(this=target)
        if isinstance(out, exp.Ordered):
            out.set("this", target)
            return out
        return target

    def _aggregate(self, name: str) -> exp.Expression:
        """The released value of aggregate ``name``, over the noisy table's columns."""
        agg = self.checked.aggregate(name)
        if name in self.plan.debiased:
            # Already clipped where the estimate has bounds: only counts are floored here.
            column = _col(_debiased_column(name))
            return _at_least(column, 0) if agg.func == "count" else column
        parts = self.plan.parts[name]
        if isinstance(parts, Measured):
            column = _col(f"__{parts.name}")
            return _at_least(column, 0) if agg.func in ("count", "count_distinct") else column
        if isinstance(parts, Avg):
            total = self.plan.measurement(parts.total)
            share = _col(f"__{parts.total}") / _at_least(_col(f"__{parts.count}"), 1)
            mean = _literal(total.centre_value) + share
            return _within_sql(mean, _literal(total.bounds.lo), _literal(total.bounds.hi))
        if not isinstance(parts, Variance):
            raise ValueError(f"{name}: a debiased sum is released from its debiased column")
        count, s1, s2 = (_col(f"__{n}") for n in parts.names)
        ms = [self.plan.measurement(n) for n in parts.names]
        widest = _literal(_max_variance(self.plan, parts))
        n = _at_least(count, 2 if agg.func.endswith("samp") else 1)
        # Means of the values' distance to the middle of the bounds and of its square:
        # each sum is released centred on its own centre.
        m1 = exp.Paren(this=_literal(ms[1].centre_value) + s1 / n)
        m2 = exp.Paren(this=_literal(ms[2].centre_value) + s2 / n)
        pop = exp.Paren(this=m2 - m1 * m1.copy())
        if agg.func.endswith("samp"):
            less_one = exp.Paren(this=n.copy() - 1)
            var = _within_sql(pop * n.copy() / less_one, exp.Literal.number(0),
                              widest * n.copy() / less_one.copy())  # fmt: skip
        else:
            var = _within_sql(pop, exp.Literal.number(0), widest)
        return exp.Sqrt(this=var) if agg.func.startswith("stddev") else var


def _is_whole(plan: Plan, name: str) -> bool:
    """Whether the aggregate's interval is its own, not one per measurement."""
    return isinstance(plan.parts.get(name), Avg | Variance)


def _max_variance(plan: Plan, parts: Variance) -> float:
    """The largest population variance of values within the argument's bounds."""
    deviation = plan.measurement(parts.centred).bounds
    return ((deviation.hi - deviation.lo) / 2) ** 2


class _Intervals:
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
        sum (most cells of a large GROUP BY) is its measurement's interval, read
        without walking the expression, as an ``(n, 2)`` array (NaN where JSON has
        null: an end not finite); other expressions are evaluated cell by cell."""
        found = self.plan.parts.get(node.name) if isinstance(node, exp.Column) else None
        agg = None if found is None else self.plan.checked.aggregate(node.name).func
        if (
            not isinstance(found, Measured)
            or agg not in ("count", "count_distinct", "sum")
            or node.name in self.debiased
        ):
            return [_json_pair(self.of(node, pid, parts)) for pid in pids]
        m = self.plan.measurement(found.name)
        half = m.noise.half_width(self.alpha / parts) if m.noise.sensitivity else 0.0
        values = np.asarray(self.noisy.values[m.name], dtype=float)
        # As ``_measured`` computes each cell (a value minus a float is a float), at once.
        value = values[np.asarray(pids, dtype=np.intp)]
        lo, hi = value - half, value + half
        if m.kind != MeasureKind.SUM:
            lo, hi = np.maximum(lo, 0.0), np.maximum(hi, 0.0)
        pairs = np.column_stack((lo, hi))
        pairs[~(np.isfinite(lo) & np.isfinite(hi))] = np.nan
        return pairs

    def of(self, node: exp.Expression, pid: int, parts: int) -> Bounds | None:
        alpha = self.alpha / parts
        return self._eval(node, pid, alpha)

    def _measured(self, m: Measurement, pid: int, alpha: float) -> Bounds:
        value = self.noisy.values[m.name][pid]
        half = m.noise.half_width(alpha) if m.noise.sensitivity else 0.0
        if m.kind != MeasureKind.SUM:
            return max(0.0, value - half), max(0.0, value + half)
        return value - half, value + half

    def _aggregate(self, name: str, pid: int, alpha: float) -> Bounds | None:
        agg = self.plan.checked.aggregate(name)
        if agg.func == "quantile":
            selection = self.plan.selection(self.plan.parts[name].names[0])
            if selection.edges is None or alpha < REPORT_ALPHA:  # they hold at 95% only
                return None
            low, high = edge_names(selection.name)
            return float(self.noisy.values[low][pid]), float(self.noisy.values[high][pid])
        parts_of = self.plan.parts[name]
        ms = [self.plan.measurement(n) for n in parts_of.names]
        if name in self.debiased:
            widths = [m.noise.half_width(alpha) if m.noise.sensitivity else 0.0 for m in ms]
            second = widths[1] if len(widths) > 1 else 0.0
            return self.debiased[name].interval(pid, alpha, (widths[0], second))
        if isinstance(parts_of, Measured | DebiasedSum):
            return self._measured(ms[0], pid, alpha)
        if isinstance(parts_of, Avg):
            return self._means(name, parts_of, alpha)[pid]
        widest = _max_variance(self.plan, parts_of)
        calibrated = self._calibrated_variance(agg.func, ms, pid, alpha, widest)
        if calibrated is not None:
            return calibrated
        # Interval arithmetic over the three measurements' intervals, alpha/3 each.
        n, s1, s2 = (self._measured(m, pid, alpha / 3) for m in ms)
        c1, c2 = ms[1].centre_value, ms[2].centre_value
        return _variance(agg.func, n, (c1, s1), (c2, s2), widest=widest)

    def _calibrated_variance(
        self, func: str, ms: list[Measurement], pid: int, alpha: float, widest: float
    ) -> Bounds | None:
        """The calibrated interval of a variance's cell (``intervals.variance_half_width``)
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
        if func.endswith("samp"):
            lo, hi, widest = lo * n / (n - 1), hi * n / (n - 1), widest * n / (n - 1)
        lo, hi = _within(lo, 0.0, widest), _within(hi, 0.0, widest)
        if func.startswith("stddev"):
            return math.sqrt(lo), math.sqrt(hi)
        return lo, hi

    def _means(self, name: str, parts: Avg, alpha: float) -> list[Bounds]:
        """The intervals of an average's cells, all computed at once (remembered per
        aggregate and level): Fieller's where it applies, else the box of its sum's
        and its count's intervals at ``alpha/2`` each."""
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
        if not usable:
            out = [self._box(total_m, count, pid, alpha / 2) for pid in range(len(sums))]
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
                alpha,
            )
            out = [
                (centre + float(a), centre + float(b))
                if n > floor
                else self._box(total_m, count, i, alpha / 2)
                for i, (a, b, n) in enumerate(zip(*ends, counts, strict=True))
            ]
        self._mean_cache[(name, alpha)] = out
        return out

    def _box(self, total_m: Measurement, count: Measurement, pid: int, alpha: float) -> Bounds:
        """Where ``centre + S/N`` lies when the sum and the count lie in their intervals."""
        lo, hi = total_m.bounds.lo, total_m.bounds.hi
        s = self._measured(total_m, pid, alpha)
        c = self._measured(count, pid, alpha)
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
            v = self.noisy.partitions[pid][key]
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None
            return float(v), float(v)
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


def _variance(
    func: str, n: Bounds, s1: tuple[float, Bounds], s2: tuple[float, Bounds], widest: float
) -> Bounds:
    """Where the variance lies when the count, the sum of the values' distances to the
    middle of the bounds and the sum of their squares lie in their intervals (each
    sum with the centre it is released around); the bounds' own range when the
    count may be too small to say anything."""
    (c1, s1), (c2, s2) = s1, s2
    samp = func.endswith("samp")
    low_n = 2 if samp else 1
    top = widest * (2 if samp else 1)
    if n[0] < low_n:
        lo, hi = 0.0, top
    else:
        means = [c1 + a / b for a in s1 for b in n]
        m_lo, m_hi = min(means), max(means)
        sq_lo = 0.0 if m_lo <= 0 <= m_hi else min(m_lo * m_lo, m_hi * m_hi)
        sq_hi = max(m_lo * m_lo, m_hi * m_hi)
        q = [c2 + a / b for a in s2 for b in n]
        lo, hi = max(min(q) - sq_hi, 0.0), min(max(q) - sq_lo, widest)
        if samp:
            lo, hi = lo * n[1] / (n[1] - 1), hi * n[0] / (n[0] - 1)
        lo, hi = min(max(lo, 0.0), top), min(max(hi, 0.0), top)
    if func.startswith("stddev"):
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


def _literal(value: float) -> exp.Expression:
    return exp.cast(exp.Literal.string(repr(float(value))), exp.DataType.Type.DOUBLE)


def _col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _at_least(value: exp.Expression, floor: int) -> exp.Expression:
    return exp.Greatest(this=value, expressions=[exp.Literal.number(floor)], ignore_nulls=True)


def _within_sql(value: exp.Expression, lo: exp.Expression, hi: exp.Expression) -> exp.Expression:
    """``LEAST(GREATEST(value, lo), hi)``."""
    low = exp.Greatest(this=value, expressions=[lo], ignore_nulls=True)
    return exp.Least(this=low, expressions=[hi], ignore_nulls=True)


def _json_column(column: Sequence[object]) -> Sequence[object]:
    """A released column with each value as JSON carries it; a column of integers, text,
    booleans and NULLs only is already so, and so is a numpy column (``wire`` writes
    a float array's non-finite values as null)."""
    if isinstance(column, np.ndarray) or set(map(type, column)) <= _JSON_READY:
        return column
    return [_json(v) for v in column]


_JSON_READY = frozenset({int, str, bool, type(None)})


def _json(value: object) -> object:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


def _json_pair(pair: Bounds | None) -> list[float] | None:
    if pair is None or not (math.isfinite(pair[0]) and math.isfinite(pair[1])):
        return None
    return [pair[0], pair[1]]
