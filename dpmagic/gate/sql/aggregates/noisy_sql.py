"""The SQL a kind's released value is written in, over the noisy table: its columns,
constants, floors and clamps. Plain sqlglot, so the kinds and the post-query pass both
build with it without importing each other."""

from __future__ import annotations

from sqlglot import exp


def literal(value: float) -> exp.Expression:
    return exp.cast(exp.Literal.string(repr(float(value))), exp.DataType.Type.DOUBLE)


def col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def noisy(name: str) -> exp.Column:
    """The noisy table's column of measurement or selection ``name``."""
    return col(f"__{name}")


def at_least(value: exp.Expression, floor: int) -> exp.Expression:
    return exp.Greatest(this=value, expressions=[exp.Literal.number(floor)], ignore_nulls=True)


def within_sql(value: exp.Expression, lo: exp.Expression, hi: exp.Expression) -> exp.Expression:
    """``LEAST(GREATEST(value, lo), hi)``."""
    low = exp.Greatest(this=value, expressions=[lo], ignore_nulls=True)
    return exp.Least(this=low, expressions=[hi], ignore_nulls=True)
