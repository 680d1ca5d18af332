"""Pass 1b: the grammar analysts write, rewritten to the grammar the checks read.

Each rule is a function from a parsed ``SELECT`` tree to an equivalent tree, in the
manner of sqlglot's optimizer rules: it returns the same query in a form the later
passes already understand, or the tree unchanged. They run in ``RULES``'s order,
right after the parameters are bound (``parse.parse``), so the canonical text, the
checks, the bounds and the work bound all see the normalised query:

    ==============  ===========================================================
    rule            what it rewrites
    ==============  ===========================================================
    intervals       ``DATE '…' ± INTERVAL '…' unit`` folded to one literal
    column_lists    ``AS t (a, b)`` after a subquery or CTE name, moved inside
    or_factoring    a conjunct repeated in every branch of an ``OR``, factored out
    decimals        ``0.06 + 0.01``: decimal literals' arithmetic folded exactly
    ==============  ===========================================================

A rule never widens what the gate accepts by itself: its output is checked by the
same passes as any query. Each rule's fixtures (input, then output) are in
``tests/golden/normalize/``; ``tests/unit/test_normalize.py`` runs them and checks
each rule's output against DuckDB on data.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dpmagic.gate.sql.normalize.column_lists import inline_column_lists
from dpmagic.gate.sql.normalize.decimals import fold_decimals
from dpmagic.gate.sql.normalize.intervals import fold_intervals
from dpmagic.gate.sql.normalize.or_factoring import factor_or

Rule = Callable[[exp.Select], exp.Select]

RULES: tuple[Rule, ...] = (fold_intervals, inline_column_lists, factor_or, fold_decimals)


def normalize(tree: exp.Select) -> exp.Select:
    """``tree`` through every rule, in order."""
    for rule in RULES:
        tree = rule(tree)
    return tree
