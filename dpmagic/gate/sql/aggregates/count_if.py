"""``COUNT_IF(c)``: the rows where ``c`` holds, counted as ``COUNT(CASE WHEN c THEN 1
END)`` is: the same noisy count (a ``COUNT``, released, bounded and judged as one),
with ``c`` checked as any row expression, as ``COUNT(*) FILTER (WHERE c)`` is."""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.sql.aggregates.count import Count


class CountIf(Count):
    star = False
    distinct = None

    def argument(self, arg: exp.Expression) -> exp.Expression:
        return exp.Case(ifs=[exp.If(this=arg.copy(), true=exp.Literal.number(1))])


COUNT_IF = CountIf()
