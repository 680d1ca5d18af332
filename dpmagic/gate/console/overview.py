"""The overview page: each dataset and the policy in force on it.

Its budgets (a query's default, each notebook's, each user's, each group's, the
dataset's for all users together) with their renewal periods, who is in each group,
whether answers are shared, and the accountant: the facts an owner checks before
changing a budget. All of it is the policy as the console read it at its start,
which is what the gate serves if both were started on the same file.

Here the page's text is gathered; ``templates/overview.html`` draws it.
"""

from __future__ import annotations

from datetime import datetime

from dpmagic.gate.console.layout import Frame, Table, number, page, when
from dpmagic.gate.policy import Budget, Dataset, Policy


def overview_page(frame: Frame, policy: Policy, read_at: datetime) -> str:
    datasets = [
        (name, *_dataset(policy, policy.datasets[name])) for name in sorted(policy.datasets)
    ]
    groups = None
    if policy.groups:
        rows = [
            [group, ", ".join(sorted(members)) or "(nobody)"]
            for group, members in sorted(policy.groups.items())
        ]
        groups = Table(["group", "members"], rows)
    return page(
        frame,
        "",
        "overview.html",
        policy=str(policy.path),
        read_at=when(read_at),
        state_dir=str(policy.gate.state_dir),
        datasets=datasets,
        groups=groups,
    )


def _dataset(policy: Policy, ds: Dataset) -> tuple[Table, Table]:
    """The dataset's policy (its facts), and its budgets."""
    tables = ", ".join(
        f"{t.name} ({'public' if t.public else 'private'})" for t in ds.tables.values()
    )
    facts = [
        ["accountant", ds.accountant.value],
        ["neighbouring datasets", ds.neighbouring.value],
        ["privacy unit", ds.privacy_unit or "each row"],
        ["engine", ds.engine.value],
        ["tables", tables],
        ["answers shared with other users", ds.share_releases.value],
    ]
    budgets: list[tuple[str, Budget]] = [
        ("a query's default", ds.query_default),
        ("each notebook", ds.notebook_budget),
        ("each user", ds.user_budget),
    ]
    for group, limit in sorted(ds.group_budgets.items()):
        members = ", ".join(sorted(policy.groups.get(group, frozenset()))) or "nobody"
        budgets.append((f"group {group} ({members})", limit))
    if ds.dataset_budget is not None:
        budgets.append(("the dataset (all users together)", ds.dataset_budget))
    rows = [
        [
            label,
            number(limit.epsilon),
            number(limit.delta),
            limit.renew.value if limit.renew else "never",
        ]
        for label, limit in budgets
    ]
    return (
        Table(["policy", "in force"], facts),
        Table(["budget", "ε", "δ", "renews"], rows, frozenset({1, 2})),
    )
