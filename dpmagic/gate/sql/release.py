"""Pass 9: post-processing on noisy values only.

The noisy vectors and the public keys are loaded into an empty in-memory
DuckDB and the query's ``SELECT`` list, ``HAVING``, ``ORDER BY`` and
``LIMIT`` are evaluated there, each DP aggregate replaced by its noisy value:
a count floored at zero, a sum as is, an average as noisy sum over noisy
count clamped into the value's bounds. Whatever this computes is
post-processing of DP outputs and costs no privacy.

Each released cell carries a 95% interval: the noise's own interval for a
single aggregate, and interval arithmetic over the aggregates' intervals
(Bonferroni-adjusted) for expressions of several.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pandas as pd
from sqlglot import exp

from dpmagic.gate.sql.check import AGGREGATES, Checked
from dpmagic.gate.sql.noise import Noisy
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan import Measurement, Plan
from dpmagic.gate.sql.rewrite import total

ALPHA = 0.05
PID = "__pid"
# An empty in-memory database that only ever sees noisy values; each release
# works in a connection of its own, whose registered table dies with it.
_POST_DB = duckdb.connect(config={"enable_external_access": False, "threads": 1})

Bounds = tuple[float, float]


@dataclass(frozen=True)
class Released:
    columns: list[str]
    rows: list[list[object]]
    accuracy: dict[str, object]


def release(noisy: Noisy, alpha: float = ALPHA) -> Released:
    plan = noisy.plan
    checked = plan.checked
    table = _noisy_table(plan, noisy)
    post = _PostExpr(plan, checked)
    select = [f'"{PID}"'] + [f"{post.sql(o.expr)} AS {_q(o.name)}" for o in checked.outputs]
    sql = f"SELECT {', '.join(select)} FROM noisy"
    if checked.having is not None:
        sql += f" WHERE {post.sql(checked.having)}"
    if checked.order:
        sql += " ORDER BY " + ", ".join(post.sql(o) for o in checked.order)
    if checked.limit is not None:
        sql += f" LIMIT {checked.limit}"
    if checked.offset is not None:
        sql += f" OFFSET {checked.offset}"
    con = _POST_DB.cursor()
    try:
        con.register("noisy", table)
        result = con.execute(sql).fetchall()
    finally:
        con.close()

    intervals = _Intervals(plan, noisy, alpha)
    accuracy_columns: list[dict[str, object] | None] = []
    for i, out in enumerate(checked.outputs):
        used = post.measurements_in(out.expr)
        if not used:
            accuracy_columns.append(None)
            continue
        measurements = [plan.measurement(n) for n in used]
        single = measurements[0] if len(measurements) == 1 else None
        accuracy_columns.append(
            {
                "mechanism": single.noise.mechanism if single else "post-processing",
                "scale": single.scale if single else None,
                "measurements": [m.label for m in measurements],
                "intervals": [
                    _json_pair(intervals.of(out.expr, row[0], len(used))) for row in result
                ],
            }
        )
        del i
    return Released(
        columns=[o.name for o in checked.outputs],
        rows=[[_json(v) for v in row[1:]] for row in result],
        accuracy={"alpha": alpha, "columns": accuracy_columns},
    )


def _noisy_table(plan: Plan, noisy: Noisy) -> pd.DataFrame:
    data: dict[str, list[object]] = {PID: list(range(len(plan.partitions)))}
    for i, key in enumerate(plan.keys):
        data[key.name] = [p[i] for p in plan.partitions]
    for m in plan.measurements:
        data[f"__{m.name}"] = noisy.values[m.name]
    return pd.DataFrame(data)


class _PostExpr:
    """Rewrites released expressions over the noisy table."""

    def __init__(self, plan: Plan, checked: Checked) -> None:
        self.plan = plan
        self.labels = {a.label: a for a in checked.aggregates}

    def measurements_in(self, node: exp.Expression) -> list[str]:
        names: list[str] = []
        for n in node.walk():
            if isinstance(n, exp.AggFunc):
                for name in self.plan.uses[n.sql(dialect=DIALECT)]:
                    if name not in names:
                        names.append(name)
        return names

    def sql(self, node: exp.Expression) -> str:
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.AggFunc) and type(n) in AGGREGATES:
                return exp.maybe_parse(self._aggregate(n), dialect=DIALECT)
            return n

        # Post-processing cannot raise either: an error would cost the user the ε
        # already charged for an answer they never see.
        return total(node.copy().transform(swap)).sql(dialect=DIALECT)

    def _aggregate(self, node: exp.AggFunc) -> str:
        agg = self.labels[node.sql(dialect=DIALECT)]
        names = self.plan.uses[agg.label]
        if agg.func == "count":
            return f'GREATEST("__{names[0]}", 0)'
        if agg.func == "sum":
            return f'"__{names[0]}"'
        total, count = (self.plan.measurement(n) for n in names)
        lo, hi = _literal(total.clamp.lo), _literal(total.clamp.hi)
        return f'LEAST(GREATEST("__{total.name}" / GREATEST("__{count.name}", 1), {lo}), {hi})'


class _Intervals:
    """Interval arithmetic over the noise's intervals, for one released cell."""

    def __init__(self, plan: Plan, noisy: Noisy, alpha: float) -> None:
        self.plan = plan
        self.noisy = noisy
        self.alpha = alpha
        self.labels = {a.label: a for a in plan.checked.aggregates}

    def of(self, node: exp.Expression, pid: int, parts: int) -> Bounds | None:
        alpha = self.alpha / parts
        return self._eval(node, pid, alpha)

    def _measured(self, m: Measurement, pid: int, alpha: float) -> Bounds:
        value = self.noisy.values[m.name][pid]
        half = m.noise.half_width(alpha) if m.noise.sensitivity else 0.0
        if m.kind == "count":
            return max(0.0, value - half), max(0.0, value + half)
        return value - half, value + half

    def _eval(self, node: exp.Expression, pid: int, alpha: float) -> Bounds | None:
        if isinstance(node, exp.AggFunc):
            agg = self.labels[node.sql(dialect=DIALECT)]
            ms = [self.plan.measurement(n) for n in self.plan.uses[agg.label]]
            if agg.func != "avg":
                return self._measured(ms[0], pid, alpha)
            total, count = ms
            s = self._measured(total, pid, alpha)
            c = self._measured(count, pid, alpha)
            lo, hi = total.clamp.lo, total.clamp.hi
            if c[0] < 1:
                return lo, hi
            corners = [a / b for a in s for b in c]
            return _within(min(corners), lo, hi), _within(max(corners), lo, hi)
        if isinstance(node, exp.Paren):
            return self._eval(node.this, pid, alpha)
        if isinstance(node, exp.Literal) and not node.is_string:
            v = float(node.this)
            return v, v
        if isinstance(node, exp.Column):
            key = next((i for i, k in enumerate(self.plan.keys) if k.name == node.name), None)
            if key is None:
                return None
            v = self.plan.partitions[pid][key]
            return (float(v), float(v)) if isinstance(v, int | float) else None
        if isinstance(node, exp.Neg):
            a = self._eval(node.this, pid, alpha)
            return None if a is None else (-a[1], -a[0])
        if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
            a = self._eval(node.this, pid, alpha)
            b = self._eval(node.expression, pid, alpha)
            return None if a is None or b is None else _arith(type(node), a, b)
        if isinstance(node, exp.Round | exp.Floor | exp.Ceil | exp.Abs | exp.TryCast):
            a = self._eval(node.this, pid, alpha)
            if a is None:
                return None
            return _unary(node, a)
        return None


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
    return a


def _within(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def _literal(value: float) -> str:
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def _json(value: object) -> object:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


def _json_pair(pair: Bounds | None) -> list[float] | None:
    if pair is None or not all(math.isfinite(x) for x in pair):
        return None
    return [pair[0], pair[1]]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
