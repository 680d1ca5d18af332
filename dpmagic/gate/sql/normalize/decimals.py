"""Fold arithmetic on decimal literals exactly, as SQL computes it: ``0.06 + 0.01``.

SQL types ``0.06`` as a DECIMAL, and DuckDB adds two of them exactly: ``0.07``. The gate
reads every decimal literal as a DOUBLE (``totality``: a decimal's scale could overflow
in arithmetic with a row's value), where ``0.06 + 0.01`` is ``0.06999999999999999``, so
TPC-H query 6's ``l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01`` left out every line
at 0.07. Here ``+``, ``-`` and ``*`` of two number literals, at least one of them with
a fractional part, are folded with Python's exact decimals into one literal, innermost
first, before anything reads them as doubles. Integers alone are left as written
(DuckDB's integer arithmetic, its overflow included, is the checks' to judge), as are
results past 18 significant digits (DuckDB's DECIMAL would round them).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from sqlglot import exp

# Digits a folded result may have: DuckDB's widest exact DECIMAL literal is 38, but a
# DOUBLE keeps about 17; beyond, the fold would claim more than the gate computes.
MAX_DIGITS = 18
OPERATIONS: dict[type, Callable[[Decimal, Decimal], Decimal]] = {
    exp.Add: Decimal.__add__,
    exp.Sub: Decimal.__sub__,
    exp.Mul: Decimal.__mul__,
}


def fold_decimals(tree: exp.Select) -> exp.Select:
    """``tree`` with every ``+``, ``-`` or ``*`` of two number literals, one of them
    decimal, folded to one exact literal (post-order, so chains fold whole)."""

    def fold(node: exp.Expr) -> exp.Expr:
        operation = OPERATIONS.get(type(node))
        if operation is None:
            return node
        a, b = _number(node.this), _number(node.expression)
        if a is None or b is None or (a[1] and b[1]):
            return node  # not two numbers, or two integers
        try:
            value = operation(a[0], b[0])
        except InvalidOperation:
            return node
        if len(value.as_tuple().digits) > MAX_DIGITS:
            return node
        return _literal(value)

    # Deepest first (a pre-order walk, reversed): a parent sees its children folded.
    for node in reversed(list(tree.walk())):
        folded = fold(node)
        if folded is not node:
            node.replace(folded)
    return tree


def _number(node: exp.Expression) -> tuple[Decimal, bool] | None:
    """A number literal's exact value and whether it is an integer; None otherwise."""
    sign = 1
    while isinstance(node, exp.Paren | exp.Neg):
        if isinstance(node, exp.Neg):
            sign = -sign
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    text = node.this
    if not all(ch.isdigit() or ch == "." for ch in text) or text.count(".") > 1:
        return None  # exponents and anything else: left as written
    return Decimal(text) * sign, "." not in text


def _literal(value: Decimal) -> exp.Expression:
    text = format(value, "f")
    if text.startswith("-"):
        return exp.Paren(this=exp.Neg(this=exp.Literal.number(text[1:])))
    return exp.Literal.number(text)
