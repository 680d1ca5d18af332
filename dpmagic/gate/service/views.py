"""What the ledger holds, as replies show it: budgets and the history of queries.

Used by the engine for live replies and by transcripts for the replies they store,
so both say the same thing the same way."""

from __future__ import annotations

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.policy import Dataset
from dpmagic.gate.service.ledger import Ledger


def budget_views(
    ledger: Ledger, user: str, dataset: Dataset, notebook: str
) -> dict[str, dict[str, dict[str, float]]]:
    """The ``budget`` object of a reply: the user's and the notebook's spent,
    limit (with grants) and remaining, as the dataset's accountant states them."""
    accountant = make_accountant(dataset.accountant)
    standing = ledger.standing(
        user, dataset.name, notebook, dataset.user_budget, dataset.notebook_budget
    )
    views = {
        scope: accountant.view(spent, limit)
        for scope, (spent, limit) in zip(("user", "notebook"), standing, strict=True)
    }
    user_left = views["user"]["remaining"]
    nb_view = views["notebook"]
    # A notebook draws on the user's budget: it can never have more left than the user.
    nb_view["remaining"] = {k: min(v, user_left[k]) for k, v in nb_view["remaining"].items()}
    return views


def history_entries(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Ledger rows (newest first) as ``/v1/history`` shows them, oldest first."""
    return [
        {
            "time": row["time"],
            "dataset": row["dataset"],
            "sql": row["sql"],
            "cost": {"epsilon": row["epsilon"], "delta": row["delta"]},
            "status": row["status"],
            "replayed": row["replayed"],
        }
        for row in reversed(rows)
    ]
