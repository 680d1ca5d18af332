"""The budgets of a query in the ledger's terms, for tests that debit a ledger directly."""

from __future__ import annotations

from dpmagic.gate.ledger.scopes import Scope
from dpmagic.gate.policy import Budget


def user_limits(
    dataset: str, user: str, notebook: str, user_cap: Budget, notebook_cap: Budget
) -> list[tuple[Scope, Budget]]:
    """A user's and a notebook's budgets, the two every query is charged against."""
    return [
        (Scope.user(dataset, user), user_cap),
        (Scope.of_notebook(dataset, user, notebook), notebook_cap),
    ]
