"""Small helpers over sqlglot trees that several passes share."""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.sql.parse import DIALECT


def unparen(node: exp.Expression) -> exp.Expression:
    """``node`` without the parentheses around it."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def conjuncts(cond: exp.Expression) -> list[exp.Expression]:
    """The terms of ``a AND b AND …``, each placed on its own where it applies."""
    cond = unparen(cond)
    if isinstance(cond, exp.And):
        return conjuncts(cond.this) + conjuncts(cond.expression)
    return [cond]


def display(expr: exp.Expression) -> str:
    """An expression as the user wrote it: its SQL without the gate's scan qualifiers
    (``__s0.age`` is shown as ``age``), for labels and messages."""

    def bare(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.table.startswith("__s"):
            return exp.column(n.name)
        return n

    # ``transform`` copies the tree (and ``bare`` replaces nodes of the copy only), so the
    # copy is the generator's to change: neither needs a copy of its own.
    return expr.transform(bare).sql(dialect=DIALECT, copy=False)
