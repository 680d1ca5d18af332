"""What the ledger holds, as replies show it: budgets and the history of queries.

Used by the engine for live replies and by transcripts for the replies they store,
so both say the same thing the same way."""

from __future__ import annotations

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.failures import required
from dpmagic.gate.ledger.scopes import ScopeKind, applicable, next_period
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Dataset
from dpmagic.protocol import Budgets, Cost, Renewal, Standing


def budget_views(
    ledger: Ledger, user: str, dataset: Dataset, notebook: str, groups: frozenset[str]
) -> Budgets:
    """The ``budget`` of a reply: each budget the user's queries are charged against,
    with its spent, limit (with grants) and remaining as the dataset's accountant
    states them: ``user`` and ``notebook`` always, ``dataset_budget`` where the owner
    set a budget for all users, ``groups`` (by name) for the user's groups that have
    one. A renewing budget says its period and when the next one begins.

    The notebook's ``remaining`` is what its next query may spend: the least left in
    any of them (a notebook draws on every budget above it), and ``binding`` names
    the budget that least is in."""
    accountant = make_accountant(dataset.accountant)
    now = ledger.now()
    limits = applicable(dataset, user, notebook, groups)
    standing = ledger.standing(limits)
    views = Budgets()
    group_views: dict[str, Standing] = {}
    binding = None
    least: dict[str, float] = {}
    for (scope, base), (spent, limit) in zip(limits, standing, strict=True):
        shown = accountant.view(spent, limit)
        view = Standing(
            spent=Cost(**shown["spent"]),
            limit=Cost(**shown["limit"]),
            remaining=Cost(**shown["remaining"]),
        )
        if base.renew is not None:
            view.renew = Renewal(period=base.renew.value, next=next_period(base.renew, now))
        remaining = shown["remaining"]
        if binding is None or remaining["epsilon"] < least["epsilon"]:
            binding = scope
        least = {k: min(v, least.get(k, v)) for k, v in remaining.items()}
        if scope.kind == ScopeKind.GROUP:
            group_views[scope.holder] = view
        elif scope.kind == ScopeKind.DATASET:  # named as in the policy: ``dataset`` names it
            views.dataset_budget = view
        elif scope.kind == ScopeKind.USER:
            views.user = view
        else:
            views.notebook = view
    notebook_view = required(views.notebook, "the notebook's budget")  # always in ``limits``
    notebook_view.remaining = Cost(**least)
    notebook_view.binding = required(binding, "a budget").named()
    if group_views:
        views.groups = group_views
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
