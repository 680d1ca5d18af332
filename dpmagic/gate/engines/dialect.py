"""What differs between the engines the gate's SQL runs on: one profile each.

``rewrite`` builds the query as a sqlglot tree; where an engine's SQL differs (its
keyed hash, its exact sum, how it counts rows per quantile candidate, how it reads a
unit's first ranks), the rewrite asks the profile, and the profile renders the
finished tree. DuckDB's profile is here; Spark's is ``engines/spark/dialect.py``. How
a row expression is kept from raising, and what Spark refuses, are rules of the SQL
passes (``sql/engine_rows.py``), chosen by the profile's ``has_try``: the profiles
import nothing from the passes, which import them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.engines.ranking import first_ranks, rank_end


@dataclass(frozen=True)
class Dialect:
    """An engine's SQL, as far as the gate's generated queries need it."""

    sqlglot: str  # the sqlglot dialect the tree is rendered in
    # Whether quantiles' counts per candidate are gathered apart from the other
    # aggregates (``rewrite._histograms_apart``), for an engine without ``histogram``.
    histograms_apart: bool = False
    # Whether every ranked table is stored in rank order, checked by the store that
    # holds it (``engines/duckdb/database.py``), so that a unit's first ``k`` ranks
    # are the rows before a row id (``first_ranks``).
    rank_prefixes: bool = False
    # Whether the engine has ``TRY(…)``, which makes a row expression that raises on a
    # row NULL there: which rule keeps its row expressions from raising
    # (``sql/engine_rows.total_on``: DuckDB's proof else TRY, or Spark's proof alone).
    has_try: bool = True

    def first_ranks(self, table: str, room: int) -> exp.Expression:
        """The filter that keeps each unit's first ``room`` ranks of a private table.

        Stored in rank order, those rows are the table's first ``n`` rows, ``n`` their
        number: ``rowid < n`` reads them without a comparison per row, where
        ``rank <= room`` beside a query's own filter cost DuckDB 14 ms of a filtered
        100M-row sum's 95 (its scan then evaluates two filters, and builds a selection
        for the second). ``n`` depends on the data, so it is a parameter
        (``ranking.rank_end``) that the store binds as it runs the SQL. The rows read are
        the same, so is the work one unit can add (docs/security.md, "Per-unit work")."""
        if not self.rank_prefixes:
            return first_ranks(table, room)
        return exp.LT(
            this=exp.column("rowid"), expression=exp.Placeholder(this=rank_end(table, room))
        )

    def hash(self, *args: exp.Expression) -> exp.Expression:
        """A keyed 64-bit hash of ``args`` (the seed among them), for row orders."""
        return exp.Anonymous(this="hash", expressions=list(args))

    def exact_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        """An exact sum of fewer than ``rows`` integers of magnitude at most ``widest``
        (``plan_types.partition_rows``).

        Where ``rows · widest < 2^63`` every partial sum, in whatever order DuckDB
        adds the rows and merges its threads' states, has magnitude below ``2^63``: a
        64-bit accumulator cannot overflow, so DuckDB's ``sum_no_overflow`` (a BIGINT
        state with no overflow check) is exact, and faster than ``SUM``, which adds
        into 128 bits (10M rows: a sum 24.3 → 21.1 ms, an average 36.8 → 24.8 ms with
        its count apart). Otherwise each value is a BIGINT summed into a HUGEINT
        (whose overflow the plan has ruled out: ``plan.SUM_LIMIT``), or a HUGEINT when
        one value may not fit 64 bits. Whether the short path is taken depends on the
        plan alone (the bounds and the query's shape), never on the data."""
        if fits_64_bits(widest, rows):
            return exp.Anonymous(
                this="sum_no_overflow", expressions=[exp.cast(value, exp.DataType.Type.BIGINT)]
            )
        wide = widest >= 2.0**62
        kind = exp.DataType.Type.INT128 if wide else exp.DataType.Type.BIGINT
        return exp.Sum(this=exp.cast(value, kind))

    def grid_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        """An exact sum of fewer than ``rows`` floats ``value`` (in grid units, each at
        most ``widest``), each rounded to an integer. DuckDB's cast of a float to an
        integer type rounds to the nearest (half to even), so the cast does the
        rounding; a ``ROUND`` before it made a 10M-row average's SQL 7% slower. The
        sum's bounds hold whichever way a value is rounded (``plan_types.grid_bounds``)."""
        return self.exact_sum(value, widest + 1, rows)  # rounded up by at most 1

    def histogram(self, value: exp.Expression) -> exp.Expression:
        """The count of rows per value (a quantile's candidate index), NULLs left out."""
        counts = exp.Anonymous(this="histogram", expressions=[value])
        kept = exp.Where(this=exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        return exp.Filter(this=counts, expression=kept)

    def render(self, tree: exp.Expression, copy: bool = True) -> str:
        """``tree``'s SQL; ``copy=False`` where no one reads the tree after (sqlglot's
        generator may change the tree it renders, so by default it renders a copy)."""
        return tree.sql(dialect=self.sqlglot, copy=copy)

    @property
    def engine(self) -> str:
        """The engine's name as replies and the dry run give it."""
        return "DuckDB"


def fits_64_bits(widest: float, rows: int) -> bool:
    """Whether every sum of fewer than ``rows`` integers of magnitude at most ``widest``
    lies strictly within a signed 64-bit integer's range, computed exactly in integers
    (a float product could round below ``2^63``)."""
    return math.ceil(widest) * rows < 2**63


DUCKDB = Dialect("duckdb")
