"""Pass 4: interval arithmetic over row expressions, from declared bounds.

The rewrite clamps every declared column to its bounds as it is read, so the
intervals computed here hold for every row whatever the data: they bound the
values summed (and so the sensitivity) and prove that integer arithmetic in
the generated SQL cannot overflow, which would otherwise turn into a
data-dependent error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused, required
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.check import (
    CONCATENATION,
    TEXT_FUNCTIONS,
    AggregateCall,
    Checked,
    date_part,
)
from dpmagic.gate.sql.keys import KeyDomain, key_domain
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.value_range import BOOL, UNBOUNDED, ValueRange

INT_LIMIT = 2**62  # integer expressions must stay well inside BIGINT
FLOAT_LIMIT = 1e300
INT_TYPES = {
    exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT,
}  # fmt: skip
# The values each cast target holds (a DOUBLE holds every finite float).
TYPE_RANGES: dict[exp.DType, tuple[float, float]] = {
    exp.DataType.Type.TINYINT: (-(2**7), 2**7 - 1),
    exp.DataType.Type.SMALLINT: (-(2**15), 2**15 - 1),
    exp.DataType.Type.INT: (-(2**31), 2**31 - 1),
    exp.DataType.Type.BIGINT: (-(2**63), 2**63 - 1),
    exp.DataType.Type.FLOAT: (-3.4028234663852886e38, 3.4028234663852886e38),
}


Env = Mapping[str, ValueRange]
NO_ENV: Env = {}


@dataclass(frozen=True)
class Bounded:
    checked: Checked
    bounds: dict[str, ValueRange]  # aggregate name -> bound of its argument
    domains: tuple[KeyDomain, ...]  # the public values of each group key, in key order


def bound(checked: Checked) -> Bounded:
    resolved = checked.resolved
    if checked.where is not None:
        value_range(checked.where, resolved)
    for scan in resolved.scans:
        if scan.on is not None:
            value_range(scan.on, resolved)
    bounds = {}
    for agg in checked.aggregates:
        if agg.arg is None:
            continue
        iv = value_range(agg.arg, resolved)
        if not kind_of(agg.func).bounded:
            continue
        if iv is None or not iv.finite:
            raise Refused(_unbounded_reason(agg, resolved))
        bounds[agg.name] = iv
    domains = tuple(key_domain(k, resolved, value_range(k.expr, resolved)) for k in checked.keys)
    return Bounded(checked=checked, bounds=bounds, domains=domains)


def value_range(node: exp.Expression, resolved: Resolved, env: Env = NO_ENV) -> ValueRange | None:
    """The interval of a row expression; ``None`` for non-numeric or always-NULL ones.

    ``env`` narrows columns where a ``CASE`` branch is known to hold.
    """
    memo = _MEMO.get()
    key = (id(node), id(env))
    if memo is not None and key in memo:
        found = memo[key][2]
        if isinstance(found, Refused):
            raise found
        return found
    try:
        iv = _range(node, resolved, env)
        if iv is not None and iv.finite:
            limit = INT_LIMIT if iv.integral else FLOAT_LIMIT
            if max(abs(iv.lo), abs(iv.hi)) > limit:
                raise Refused(
                    f"{node.sql(dialect=DIALECT)} could overflow: its values may reach "
                    f"{max(abs(iv.lo), abs(iv.hi)):.3g} under the declared bounds"
                )
    except Refused as exc:
        if memo is not None:
            memo[key] = (node, env, exc)
        raise
    if memo is not None:
        memo[key] = (node, env, iv)  # holding both keeps their ids from being reused
    return iv


# Intervals already computed, by node and environment, while a ``memoised`` block runs:
# a pass that asks for the interval of every node of a tree stays linear in its size.
_MEMO: ContextVar[
    dict[tuple[int, int], tuple[exp.Expression, Env, ValueRange | Refused | None]] | None
] = ContextVar("interval_memo", default=None)


@contextmanager
def memoised() -> Iterator[None]:
    """Remember intervals within the block (the trees must not change meanwhile)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _range(node: exp.Expression, r: Resolved, env: Env) -> ValueRange | None:
    if isinstance(node, exp.Paren):
        return value_range(node.this, r, env)
    if isinstance(node, exp.Column):
        col = r.column(node)
        if col is None:
            return UNBOUNDED
        if col.type == "bool":
            return BOOL
        if col.lower is None or col.upper is None or col.type not in ("int", "float"):
            return UNBOUNDED if col.type in ("int", "float") else None
        return env.get(_key(node)) or ValueRange(col.lower, col.upper, col.type == "int")
    part = date_part(node)
    if part is not None:
        return _date_part_range(node, part, r)
    if isinstance(node, exp.Boolean):
        return BOOL
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal):
        if node.is_string:
            return None
        value = float(node.this)
        return ValueRange(value, value, node.is_int)
    if isinstance(node, exp.Neg):
        a = value_range(node.this, r, env)
        return None if a is None else ValueRange(-a.hi, -a.lo, a.integral)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div | exp.IntDiv | exp.Mod):
        return _arith(node, value_range(node.this, r, env), value_range(node.expression, r, env))
    if isinstance(node, exp.Predicate | exp.Connector | exp.Not | exp.Like | exp.ILike):
        for child in node.iter_expressions():
            value_range(child, r, env)
        return BOOL
    if isinstance(node, exp.Case):
        return _case(node, r, env)
    if isinstance(node, exp.If):
        value_range(node.this, r, env)
        return _hull([node.args.get("true"), node.args.get("false")], r, env)
    if isinstance(node, exp.Greatest | exp.Least):
        return _extreme(node, r, env)
    if isinstance(node, exp.Coalesce):
        return _hull([node.this, *node.expressions], r, env)
    if isinstance(node, exp.Nullif):
        value_range(node.expression, r, env)
        return value_range(node.this, r, env)
    if isinstance(node, exp.Abs):
        a = value_range(node.this, r, env)
        if a is None:
            return None
        low = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
        return ValueRange(low, max(abs(a.lo), abs(a.hi)), a.integral)
    if isinstance(node, exp.Round | exp.Floor | exp.Ceil):
        a = value_range(node.this, r, env)
        if a is None or a.integral or not a.finite:
            return a
        # ROUND(x, n) may land up to half a unit beyond the interval's ends.
        return ValueRange(math.floor(a.lo) - 1, math.ceil(a.hi) + 1, False)
    if isinstance(node, TEXT_FUNCTIONS + CONCATENATION):
        for operand in node.iter_expressions():
            value_range(operand, r, env)
        if isinstance(node, exp.Length):  # at most the text's longest value
            return ValueRange(0, text_length(node.this, r), True)
        return None  # text has no interval
    if isinstance(node, exp.TryCast):
        return _try_cast(value_range(node.this, r, env), node.to.this)
    return UNBOUNDED


def _try_cast(a: ValueRange | None, to: exp.DType) -> ValueRange | None:
    """``TRY_CAST`` rounds into the target type, and a value outside the type's range
    becomes NULL: a finite interval is cut to the range (``None`` when nothing is left,
    the cast being NULL on every row)."""
    if to == exp.DataType.Type.BOOLEAN:
        return BOOL
    if a is None or not a.finite:
        return UNBOUNDED
    lo: float
    hi: float
    if to in INT_TYPES:
        lo, hi = math.floor(a.lo), math.ceil(a.hi)
        integral = True
    else:
        lo, hi, integral = a.lo, a.hi, False
    low, high = TYPE_RANGES.get(to, (-math.inf, math.inf))
    lo, hi = max(lo, low), min(hi, high)
    return ValueRange(lo, hi, integral) if lo <= hi else None


# Characters of a number, date or boolean written as text (a HUGEINT has 40).
NON_TEXT_LENGTH = 64
# Characters one character can become in UPPER or LOWER (a few become three).
CASE_EXPANSION = 3


def text_length(node: exp.Expression, r: Resolved) -> int:
    """The most characters a value of ``node`` can have as text, for every row: a
    column keeps at most its ``max_length`` (cut at load), a literal its own, a
    concatenation the sum of its parts, a choice (``CASE``, ``COALESCE``, …) its
    longest branch, a case mapping ``CASE_EXPANSION`` times its text; a number, date
    or boolean written as text at most ``NON_TEXT_LENGTH``. Total over the row
    grammar: every size derived from a text is bounded by construction."""
    if isinstance(node, exp.Paren):
        return text_length(node.this, r)
    col = r.column(node)
    if col is not None:
        return col.max_length if col.max_length is not None else NON_TEXT_LENGTH
    if isinstance(node, exp.Literal):
        return len(node.this) if node.is_string else NON_TEXT_LENGTH
    if isinstance(node, exp.Null):
        return 0
    if isinstance(node, exp.Upper | exp.Lower):
        return CASE_EXPANSION * text_length(node.this, r)
    if isinstance(node, exp.Trim):
        return text_length(node.this, r)
    if isinstance(node, exp.Substring | exp.Right | exp.Left):
        # At most the length asked for, where it is a literal (``check`` requires one).
        length = node.args.get("length") or node.args.get("expression")
        whole = text_length(node.this, r)
        if isinstance(length, exp.Literal) and length.is_int and int(length.this) >= 0:
            return min(whole, int(length.this))
        return whole
    if isinstance(node, exp.DPipe):
        return text_length(node.this, r) + text_length(node.expression, r)
    if isinstance(node, exp.Concat):
        return sum(text_length(e, r) for e in node.expressions)
    branches = _branches(node)
    if branches is not None:
        return max((text_length(b, r) for b in branches), default=0)
    return NON_TEXT_LENGTH  # a number, date or boolean: nothing else is allowed on rows


def _branches(node: exp.Expression) -> list[exp.Expression] | None:
    """The values a choice may return (its conditions apart); ``None`` if ``node`` is
    not a choice."""
    if isinstance(node, exp.Case):
        found = [i.args.get("true") for i in node.args.get("ifs") or []]
        return [b for b in [*found, node.args.get("default")] if b is not None]
    if isinstance(node, exp.If):
        return [b for b in (node.args.get("true"), node.args.get("false")) if b is not None]
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Nullif):
        return [node.this]
    return None


_DATE_PART_RANGES = {
    "month": (1, 12), "day": (1, 31), "quarter": (1, 4), "dow": (0, 6), "doy": (1, 366),
    "week": (1, 53),
}  # fmt: skip


def _date_part_range(node: exp.Expression, part: str, r: Resolved) -> ValueRange:
    """Calendar parts have fixed ranges; the year lies between the years of the
    date column's declared bounds (a date literal's year is itself)."""
    if part != "year":
        return ValueRange(*_DATE_PART_RANGES[part], True)
    arg = node.expression if isinstance(node, exp.Extract) else node.this
    col = r.column(arg)
    if col is not None and col.dates is not None:
        return ValueRange(col.dates[0].year, col.dates[1].year, True)
    if isinstance(arg, exp.Cast) and isinstance(arg.this, exp.Literal):
        year = int(arg.this.this[:4])
        return ValueRange(year, year, True)
    return UNBOUNDED


def _arith(node: exp.Expression, a: ValueRange | None, b: ValueRange | None) -> ValueRange | None:
    if a is None or b is None:
        return None
    if not (a.finite and b.finite):
        return UNBOUNDED
    integral = a.integral and b.integral
    if isinstance(node, exp.Add):
        return ValueRange(a.lo + b.lo, a.hi + b.hi, integral)
    if isinstance(node, exp.Sub):
        return ValueRange(a.lo - b.hi, a.hi - b.lo, integral)
    if isinstance(node, exp.Mul):
        corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        return ValueRange(min(corners), max(corners), integral)
    if isinstance(node, exp.Mod):
        # The remainder is smaller than the divisor and takes the dividend's sign.
        m = max(abs(b.lo), abs(b.hi))
        return ValueRange(-m if a.lo < 0 else 0, m if a.hi > 0 else 0, integral)
    # Division: the rewrite turns a zero divisor into NULL. An integer divisor is
    # then at least 1 away from zero; a float one can come arbitrarily close.
    if b.lo == b.hi == 0:
        return None
    if b.lo <= 0 <= b.hi and not b.integral:
        return UNBOUNDED
    if b.lo < 0 < b.hi:  # an integer divisor of either sign: |q| <= |a| / 1
        m = max(abs(a.lo), abs(a.hi))
        lo, hi = -m, m
    else:
        d_lo, d_hi = (1 if b.lo == 0 else b.lo), (-1 if b.hi == 0 else b.hi)
        quotients = [x / y for x in (a.lo, a.hi) for y in (d_lo, d_hi)]
        lo, hi = min(quotients), max(quotients)
    if isinstance(node, exp.IntDiv):
        return ValueRange(math.floor(lo), math.ceil(hi), integral)
    return ValueRange(lo, hi, False)


def _hull(nodes: list[exp.Expression | None], r: Resolved, env: Env) -> ValueRange | None:
    out = None
    for node in nodes:
        if node is None:
            continue
        iv = value_range(node, r, env)
        if iv is None:
            continue
        out = iv if out is None else out.hull(iv)
    return out


def _case(node: exp.Case, r: Resolved, env: Env) -> ValueRange | None:
    """Each THEN is bounded where its WHEN holds and every earlier WHEN failed;
    the ELSE where all failed. ``CASE WHEN x > 9 THEN 9 ELSE x END`` is in [lo, 9]."""
    out: ValueRange | None = None
    for branch in node.args.get("ifs", []):
        value_range(branch.this, r, env)
        value = value_range(branch.args["true"], r, _narrow(branch.this, True, r, env))
        out = value if out is None else (out if value is None else out.hull(value))
        env = _narrow(branch.this, False, r, env)
    default = node.args.get("default")
    value = value_range(default, r, env) if default is not None else None
    return value if out is None else (out if value is None else out.hull(value))


def _extreme(node: exp.Greatest | exp.Least, r: Resolved, env: Env) -> ValueRange | None:
    """DuckDB's LEAST and GREATEST skip NULLs, so any one argument may be the result;
    an argument that is never NULL (a literal) caps it nonetheless."""
    args = [node.this, *node.expressions]
    ivs = [value_range(a, r, env) for a in args]
    known = [iv for iv in ivs if iv is not None]
    if not known:
        return None
    hull = known[0]
    for iv in known[1:]:
        hull = hull.hull(iv)
    sure = [iv for a, iv in zip(args, ivs, strict=True) if iv is not None and _never_null(a)]
    if not sure:
        return hull
    if isinstance(node, exp.Least):
        return ValueRange(hull.lo, min(hull.hi, min(iv.hi for iv in sure)), hull.integral)
    return ValueRange(max(hull.lo, max(iv.lo for iv in sure)), hull.hi, hull.integral)


def _never_null(node: exp.Expression) -> bool:
    if isinstance(node, exp.Paren | exp.Neg):
        return _never_null(node.this)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul):
        return _never_null(node.this) and _never_null(node.expression)
    return isinstance(node, exp.Literal) and not node.is_string


_FLIP: dict[type[exp.Expression], type[exp.Expression]] = {
    exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ,
}  # fmt: skip
_NEGATE: dict[type[exp.Expression], type[exp.Expression]] = {
    exp.GT: exp.LTE, exp.GTE: exp.LT, exp.LT: exp.GTE, exp.LTE: exp.GT,
}  # fmt: skip


def _narrow(cond: exp.Expression, holds: bool, r: Resolved, env: Env) -> Env:
    """Column intervals where ``cond`` is known true (or known not true).

    Only comparisons of a bounded column with a number, under AND (when true)
    and OR (when false), narrow anything; every other condition leaves the
    intervals as they are, which is always sound. A row whose column is NULL
    makes any expression of that column NULL, so narrowing its non-NULL
    values is all that matters.
    """
    while isinstance(cond, exp.Paren):
        cond = cond.this
    if isinstance(cond, exp.Not):
        return _narrow(cond.this, not holds, r, env)
    if (isinstance(cond, exp.And) and holds) or (isinstance(cond, exp.Or) and not holds):
        return _narrow(cond.expression, holds, r, _narrow(cond.this, holds, r, env))
    op = type(cond)
    if op not in _FLIP:
        return env
    column, number = cond.this, cond.expression
    if not isinstance(column, exp.Column):
        column, number, op = number, column, _FLIP[op]
    if not (isinstance(column, exp.Column) and isinstance(number, exp.Literal)) or number.is_string:
        return env
    col = r.column(column)
    if col is None or col.lower is None or col.upper is None or col.type not in ("int", "float"):
        return env
    if not holds:
        if op is exp.EQ:
            return env
        op = _NEGATE[op]
    current = env.get(_key(column)) or ValueRange(col.lower, col.upper, col.type == "int")
    c = float(number.this)
    if not math.isfinite(c):  # 1e400: nothing to narrow to
        return env
    lo, hi = current.lo, current.hi
    step = 1 if current.integral else 0  # a strict bound on an int moves to the next int
    if op is exp.EQ:
        lo, hi = max(lo, c), min(hi, c)
    elif op is exp.GT:
        lo = max(lo, math.floor(c) + 1 if step else c)
    elif op is exp.GTE:
        lo = max(lo, math.ceil(c) if step else c)
    elif op is exp.LT:
        hi = min(hi, math.ceil(c) - 1 if step else c)
    elif op is exp.LTE:
        hi = min(hi, math.floor(c) if step else c)
    if lo > hi:  # the branch can never run for a non-NULL value
        lo, hi = current.lo, current.lo
    return {**env, _key(column): ValueRange(lo, hi, current.integral)}


def _key(column: exp.Column) -> str:
    return f"{column.table}.{column.name}"


def _unbounded_reason(agg: AggregateCall, r: Resolved) -> str:
    arg = required(agg.arg, "an aggregate's argument")
    if _range(arg, r, NO_ENV) is None:
        return f"{agg.label} aggregates a value that is not a number"
    units = sorted({c.name for c in arg.find_all(exp.Column) if r.is_unit(c)})
    if units:
        return (
            f"{agg.label} would release values of the privacy unit {units[0]!r}: "
            f"only COUNT(DISTINCT {units[0]}) may aggregate it"
        )
    declared = [(c, r.column(c)) for c in arg.find_all(exp.Column)]
    unbounded = sorted(
        {
            col.name
            for _, col in declared
            if col is not None and col.lower is None and col.type in ("int", "float")
        }
    )
    if unbounded:
        return (
            f"{agg.label} has no finite bound: declare lower and upper for "
            + ", ".join(repr(c) for c in unbounded)
            + " in the policy"
        )
    if any(True for _ in arg.find_all(exp.Div)):
        return f"{agg.label} has no finite bound: a divisor can come arbitrarily close to zero"
    return (
        f"{agg.label} has no finite bound: clamp its argument, e.g. LEAST(GREATEST(x, low), high)"
    )
