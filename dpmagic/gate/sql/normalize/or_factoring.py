"""Rule: a condition repeated in every branch of an ``OR`` is taken out of it.

TPC-H's query 19 writes its join key in each of three branches:
``(p_partkey = l_partkey AND …) OR (p_partkey = l_partkey AND …) OR (…)``. Read as
written, the join has no equality the checks can see: a condition join, priced at
the product of the tables. By distributivity, ``(a AND b) OR (a AND c)`` is
``a AND (b OR c)``, which holds in SQL's three-valued logic too (Kleene's logic is
a distributive lattice), so the rule rewrites it, and the equality joins. When a
branch is the common part alone, absorption (``a OR (a AND b)`` is ``a``) leaves
the common part alone.

Conjuncts match when their trees are equal as sqlglot compares them (the same
text up to the case of keywords): ``p_partkey = l_partkey`` and
``l_partkey = p_partkey`` are different conjuncts, left in their branches.
"""

from __future__ import annotations

from sqlglot import exp


def factor_or(tree: exp.Select) -> exp.Select:
    """Every ``OR`` in ``tree`` whose branches share conjuncts, those taken out,
    innermost first."""
    for node in list(tree.find_all(exp.Or))[::-1]:
        if isinstance(node.parent, exp.Or):
            continue  # the outermost OR of a chain takes all its branches at once
        factored = _factored(node)
        if factored is not None:
            node.replace(factored)
    return tree


def _factored(node: exp.Or) -> exp.Expr | None:
    branches = [list(_conjuncts(b)) for b in _branches(node)]
    common = [c for c in branches[0] if all(c in b for b in branches[1:])]
    if not common:
        return None
    rests = [[c for c in b if c not in common] for b in branches]
    parts = [c.copy() for c in common]
    if all(rests):  # else absorption: a branch was the common part alone
        parts.append(exp.paren(exp.or_(*(exp.and_(*(c.copy() for c in r)) for r in rests))))
    factored: exp.Expr = exp.and_(*parts)
    return exp.paren(factored) if isinstance(node.parent, exp.Binary) else factored


def _branches(node: exp.Expr) -> list[exp.Expr]:
    return _chain(node, exp.Or)


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    return _chain(node, exp.And)


def _chain(node: exp.Expr, kind: type[exp.Connector]) -> list[exp.Expr]:
    """The operands of a chain of ``kind`` (``a OR b OR c``, parenthesised or not), left
    to right; iterative, since a 20,000-character query can chain thousands."""
    out, stack = [], [node]
    while stack:
        inner = stack.pop().unnest()
        if isinstance(inner, kind):
            stack += [inner.expression, inner.this]
        else:
            out.append(inner)
    return out
