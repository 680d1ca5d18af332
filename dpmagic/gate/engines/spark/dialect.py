"""Spark's profile: the same plan's SQL for Spark where Spark's SQL is not DuckDB's.

The rewrite builds one tree for every engine; this profile decides the few places
where Spark's SQL differs. Which row expressions Spark may run at all (it has no
``TRY``, and evaluates some expressions differently) is decided among the SQL passes,
by ``sql/engine_rows.py``'s Spark rule, which this profile's ``has_try`` selects.

* **Keyed hash**: ``xxhash64(…, seed)`` (Spark's ``hash`` is 32 bits).
* **Exact sums**: Spark's BIGINT sum overflows, and with ANSI mode (pinned on in
  every session) raises: a failure that would depend on the data. So a sum is a
  BIGINT sum only where ``plan_types.partition_rows`` rows (more than the sum can add
  up: ``2^40``, ``interface.MAX_ROWS``, more than any table has, times a unit's rows
  after a join) of the largest value fit in a BIGINT, and
  ``SUM(CAST(v AS DECIMAL(38,0)))`` otherwise: DECIMAL(38,0) holds
  ``10^38 - 1 > 2^126``, and the plan refuses any sum whose values could reach
  ``2^126`` over those rows (``plan.SUM_LIMIT``).
  (DECIMAL sums cost Spark about twice as much: an average of incomes at 10M rows
  took 1.7 s with them.)
* **Quantiles** count rows per candidate with DuckDB's ``histogram``, which Spark
  lacks: the rewrite counts them by ``GROUP BY`` the keys and the candidate and
  gathers each key's counts into a map (``rewrite._histograms_apart``), never an
  approximate percentile.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.engines.dialect import Dialect, fits_64_bits

EXACT = exp.DataType.build("DECIMAL(38, 0)")


@dataclass(frozen=True)
class SparkDialect(Dialect):
    """Spark SQL as the gate generates it (see the module's docstring)."""

    sqlglot: str = "spark"
    histograms_apart: bool = True
    has_try: bool = False

    def hash(self, *args: exp.Expression) -> exp.Expression:
        return exp.Anonymous(this="xxhash64", expressions=list(args))

    def exact_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        if fits_64_bits(widest, rows):  # fewer rows than ``rows``: a BIGINT sum cannot overflow
            return exp.Sum(this=exp.cast(value, exp.DataType.Type.BIGINT))
        return exp.Sum(this=exp.Cast(this=value, to=EXACT.copy()))

    def grid_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        # Spark's cast to an integer truncates: rounding to the nearest is asked for,
        # which moves a value up by at most 1.
        return self.exact_sum(exp.Round(this=value), widest + 1, rows)

    @property
    def engine(self) -> str:
        return "Spark"


SPARK = SparkDialect()
