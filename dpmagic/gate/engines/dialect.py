"""What differs between the engines the gate's SQL runs on: one profile each.

``rewrite`` builds the query as a sqlglot tree; where an engine's SQL differs (its
keyed hash, its exact sum, how it counts rows per quantile candidate, how a row
expression is kept from raising: ``total``), the rewrite asks the profile, and the
profile renders the finished tree. DuckDB's profile is here; Spark's, which refuses
what Spark would answer differently, is ``engines/spark/dialect.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.totality import total


@dataclass(frozen=True)
class Dialect:
    """An engine's SQL, as far as the gate's generated queries need it."""

    sqlglot: str  # the sqlglot dialect the tree is rendered in
    # Whether quantiles' counts per candidate are gathered apart from the other
    # aggregates (``rewrite._histograms_apart``), for an engine without ``histogram``.
    histograms_apart: bool = False

    def hash(self, *args: exp.Expression) -> exp.Expression:
        """A keyed 64-bit hash of ``args`` (the seed among them), for row orders."""
        return exp.Anonymous(this="hash", expressions=list(args))

    def exact_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        """An exact sum of fewer than ``rows`` integers of magnitude at most ``widest``
        (``plan.partition_rows``): DuckDB sums BIGINTs into a HUGEINT (128 bits,
        whose overflow the plan has ruled out), faster than HUGEINTs, so each value is
        a BIGINT unless one may not fit."""
        wide = widest >= 2.0**62
        kind = exp.DataType.Type.INT128 if wide else exp.DataType.Type.BIGINT
        return exp.Sum(this=exp.cast(value, kind))

    def grid_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        """An exact sum of fewer than ``rows`` floats ``value`` (in grid units, each at
        most ``widest``), each rounded to an integer. DuckDB's cast of a float to an
        integer type rounds to the nearest (half to even), so the cast does the
        rounding; a ``ROUND`` before it made a 10M-row average's SQL 7% slower. The
        sum's bounds hold whichever way a value is rounded (``plan._grid_bounds``)."""
        return self.exact_sum(value, widest, rows)

    def fused_sum(self, value: exp.Expression, bits: int) -> exp.Expression | None:
        """One aggregate for both the exact sum of the integers ``value`` (floats in grid
        units are rounded by the cast, as in ``grid_sum``) and the count of the rows
        that have one: ``SUM(value·2^bits + 1)``, ``S·2^bits + N``, from which the gate
        takes ``S`` and ``N`` apart (``rewrite.Fused`` says when that is exact). A
        second aggregate made a 10M-row average's SQL 30% slower than one; each term
        is a BIGINT, summed exactly into a HUGEINT. None: the engine has no such sum."""
        term = exp.Mul(
            this=exp.cast(value, exp.DataType.Type.BIGINT), expression=exp.Literal.number(1 << bits)
        )
        return exp.Sum(this=exp.Add(this=term, expression=exp.Literal.number(1)))

    def histogram(self, value: exp.Expression) -> exp.Expression:
        """The count of rows per value (a quantile's candidate index), NULLs left out."""
        counts = exp.Anonymous(this="histogram", expressions=[value])
        kept = exp.Where(this=exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        return exp.Filter(this=counts, expression=kept)

    def total(
        self, tree: exp.Expression, resolved: Resolved, condition: bool = False
    ) -> exp.Expression:
        """``tree`` (a row expression over private rows) in a form that cannot raise on
        any row: DuckDB's is proven total from types and intervals, else under ``TRY``
        (``totality``); ``condition`` for a WHERE or ON."""
        return total(tree, resolved, condition)

    def render(self, tree: exp.Expression) -> str:
        return tree.sql(dialect=self.sqlglot)

    @property
    def engine(self) -> str:
        """The engine's name as replies and the dry run give it."""
        return "DuckDB"


DUCKDB = Dialect("duckdb")
