"""The query's ``SELECT`` list, ``HAVING`` and ``ORDER BY`` over the noisy table: each DP
aggregate replaced by its released value, which its kind writes from noisy columns
only (``Aggregate.released``: a count floored at zero, a sum as is, an average as its
centre plus its noisy centred sum over its noisy count, clamped into its bounds, a
variance from its three measurements), so what the release pass evaluates with these
trees is post-processing. Made from the plan alone, once per analysis (``post_query``).

The noisy table names a measurement's column ``__<name>``, a debiased aggregate's
``debiased_column``, and the partition id ``PID``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.sql.aggregates.noisy_sql import col
from dpmagic.gate.sql.aggregates.parts import Avg, Trimmed, Variance
from dpmagic.gate.sql.aggregates.registry import kind_of
from dpmagic.gate.sql.totality import generated

if TYPE_CHECKING:
    from dpmagic.gate.sql.check import Checked
    from dpmagic.gate.sql.plan_types import Plan

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
        kind = kind_of(self.checked.aggregate(name).func)
        if name in self.plan.debiased:
            return kind.released_debiased(col(debiased_column(name)))
        return kind.released(self.plan, self.plan.parts[name])


def _is_whole(plan: Plan, name: str) -> bool:
    """Whether the aggregate's interval is its own, not one per measurement."""
    return isinstance(plan.parts.get(name), Avg | Variance | Trimmed)
