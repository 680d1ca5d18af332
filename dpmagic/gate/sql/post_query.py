"""The query's ``SELECT`` list, ``HAVING`` and ``ORDER BY`` over the noisy table: each DP
aggregate replaced by its released value, computed from noisy columns only (a count
floored at zero, a sum as is, an average as its centre plus its noisy centred sum over
its noisy count, clamped into its bounds, a variance from its three measurements), so
what the release pass evaluates with these trees is post-processing. Made from the
plan alone, once per analysis (``post_query``).

The noisy table names a measurement's column ``__<name>``, a debiased aggregate's
``debiased_column``, and the partition id ``PID``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from sqlglot import exp

from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.aggregates.parts import Avg, Measured, Variance, narrowed
from dpmagic.gate.sql.aggregates.variance import Spread, spread
from dpmagic.gate.sql.check import Checked
from dpmagic.gate.sql.plan_types import Plan, max_variance
from dpmagic.gate.sql.totality import generated

PID = "__pid"


@dataclass(frozen=True)
class PostQuery:
    """The query's SELECT list (the partition id first), HAVING and ORDER BY over the
    noisy table: trees made from the plan alone, so once per analysis (``pipeline
    .generate``), not once per answer (0.1–0.4 ms of sqlglot copies each time)."""

    exprs: tuple[exp.Expression, ...]
    having: exp.Expression | None
    order: tuple[exp.Expression, ...]


def post_query(plan: Plan) -> PostQuery:
    post = PostExpr(plan, plan.checked)
    checked = plan.checked
    return PostQuery(
        exprs=(col(PID), *(post.tree(o.expr) for o in checked.outputs)),
        having=None if checked.having is None else post.tree(checked.having),
        order=tuple(post.tree(o) for o in checked.order),
    )


def debiased_column(name: str) -> str:
    return f"{name}_debiased"


class PostExpr:
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
        func = self.checked.aggregate(name).func
        if name in self.plan.debiased:
            # Already clipped where the estimate has bounds: only counts are floored here.
            column = col(debiased_column(name))
            return at_least(column, 0) if func is AggregateFunc.COUNT else column
        parts = self.plan.parts[name]
        match func:
            case AggregateFunc.COUNT | AggregateFunc.COUNT_DISTINCT:
                return at_least(col(f"__{parts.names[0]}"), 0)
            case AggregateFunc.SUM | AggregateFunc.QUANTILE:
                if not isinstance(parts, Measured):
                    raise ValueError(f"{name}: a debiased sum is released from its column")
                return col(f"__{parts.name}")
            case AggregateFunc.AVG:
                return self._average(narrowed(parts, Avg))
            case (
                AggregateFunc.VAR_SAMP
                | AggregateFunc.VAR_POP
                | AggregateFunc.STDDEV_SAMP
                | AggregateFunc.STDDEV_POP
            ):
                return self._variance(narrowed(parts, Variance), spread(func))
            case unknown:
                assert_never(unknown)

    def _average(self, parts: Avg) -> exp.Expression:
        """An average: its centre plus its centred sum over its count, within its bounds."""
        total = self.plan.measurement(parts.total)
        share = col(f"__{parts.total}") / at_least(col(f"__{parts.count}"), 1)
        mean = literal(total.centre_value) + share
        return within_sql(mean, literal(total.bounds.lo), literal(total.bounds.hi))

    def _variance(self, parts: Variance, kind: Spread) -> exp.Expression:
        """A variance (or its square root) from its count and centred sums."""
        count, s1, s2 = (col(f"__{n}") for n in parts.names)
        ms = [self.plan.measurement(n) for n in parts.names]
        widest = literal(max_variance(self.plan, parts))
        n = at_least(count, 2 if kind.sample else 1)
        # Means of the values' distance to the middle of the bounds and of its square:
        # each sum is released centred on its own centre.
        m1 = exp.Paren(this=literal(ms[1].centre_value) + s1 / n)
        m2 = exp.Paren(this=literal(ms[2].centre_value) + s2 / n)
        pop = exp.Paren(this=m2 - m1 * m1.copy())
        if kind.sample:
            less_one = exp.Paren(this=n.copy() - 1)
            var = within_sql(pop * n.copy() / less_one, exp.Literal.number(0),
                              widest * n.copy() / less_one.copy())  # fmt: skip
        else:
            var = within_sql(pop, exp.Literal.number(0), widest)
        return exp.Sqrt(this=var) if kind.root else var


def _is_whole(plan: Plan, name: str) -> bool:
    """Whether the aggregate's interval is its own, not one per measurement."""
    return isinstance(plan.parts.get(name), Avg | Variance)


def literal(value: float) -> exp.Expression:
    return exp.cast(exp.Literal.string(repr(float(value))), exp.DataType.Type.DOUBLE)


def col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def at_least(value: exp.Expression, floor: int) -> exp.Expression:
    return exp.Greatest(this=value, expressions=[exp.Literal.number(floor)], ignore_nulls=True)


def within_sql(value: exp.Expression, lo: exp.Expression, hi: exp.Expression) -> exp.Expression:
    """``LEAST(GREATEST(value, lo), hi)``."""
    low = exp.Greatest(this=value, expressions=[lo], ignore_nulls=True)
    return exp.Least(this=low, expressions=[hi], ignore_nulls=True)
