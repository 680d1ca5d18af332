"""Rule: how many more queries of one cost the budgets that apply still allow.

The ledger debits a query only if it fits every budget that applies to it
(``ledger/store.Ledger.debit``): the dataset's, each of the user's groups', the user's
and the notebook's (``scopes.applicable``), each checked by the dataset's
accountant as ``fits(spent, cost, limit)``. After ``n``
more queries of cost ``c`` a scope has spent ``spent`` composed with ``n`` copies
of ``c`` (``accounting.compose``: ε and δ add up, and ρ); so the queries that fit
are the largest ``n`` for which ``fits(spent, c composed n times, limit)`` holds in
every scope, the least of the scopes' counts.

Proof that a search finds it: every amount of ``c`` is at least 0, so each amount
of ``n`` copies grows with ``n``; each accountant's ``fits`` bounds amounts from
above (ε and δ under ``pure`` and ``approx``, ρ under ``zcdp``), so if ``n + 1``
copies fit then ``n`` do. The predicate is monotone and doubling then bisection
find its last ``n`` with the accountant's own ``fits`` at every step; ``c`` with
no positive amount would fit without end and is refused.

The ledger adds a charge to a total it keeps exact and rounds once
(``accounting.Composition``); here ``n`` copies are composed exactly and rounded once, then
composed with ``spent``: the two differ by a few units in the last place, far
inside the accountants' slack (``accounting._SLACK``, 10^-9), so they disagree only
for a total within a few ulps of that slack's edge.

A renewing budget is counted as it stands now: its next period allows more.
Nothing here reads data: the cost is a plan's, the standings the ledger's.
``tests/unit/dp/test_preview.py`` checks, for each accountant, that ``n`` queries
fit one after another as the ledger checks them and the ``n + 1``-th does not,
and that composing ``n`` copies is ``compose`` of the list of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpmagic.gate.dp.accounting import Accountant, Cost, compose
from dpmagic.gate.policy import Budget

Standing = tuple[Cost, Budget]
"""One budget that applies: what its scope spent, and its limit (``Ledger.standing``)."""


def repeated(cost: Cost, n: int) -> Cost:
    """``compose([cost] * n)``, in ``log n`` compositions: ``cost`` doubled by
    ``compose([x, x])`` (exact: a float's double is a float, or infinite, as the
    list's sum would be) and the doublings that make up ``n`` composed once, which
    rounds their exact sum once, as ``math.fsum`` of the whole list does."""
    pieces, piece = [], cost
    while n:
        if n & 1:
            pieces.append(piece)
        piece, n = compose([piece, piece]), n >> 1
    return compose(pieces)


def queries_that_fit(accountant: Accountant, standings: Sequence[Standing], cost: Cost) -> int:
    """How many more queries of ``cost`` every one of ``standings`` allows, by
    ``accountant``'s composition and its ``fits`` (the module's rule)."""
    if not (cost.epsilon > 0 or cost.delta > 0 or cost.rho > 0):
        raise ValueError("a query that costs nothing fits without end")

    def fit(n: int) -> bool:
        total = repeated(cost, n)
        return all(accountant.fits(spent, total, limit) for spent, limit in standings)

    if not fit(1):
        return 0
    low, high = 1, 2  # fit(low), and high to find
    while fit(high):
        if repeated(cost, high) == repeated(cost, low):
            # Composition adds up, so more copies cost more until they overflow and stop
            # fitting: a total that stops growing is the gate's own bug, not a forever.
            raise RuntimeError("internal error: composing more queries costs no more")
        low, high = high, 2 * high
    while high - low > 1:  # fit(low) and not fit(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fit(mid) else (low, mid)
    return low
