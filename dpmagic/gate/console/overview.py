"""The overview page: each dataset and the policy in force on it.

Its budgets (a query's default, each notebook's, each user's, each group's, the
dataset's for all users together) with their renewal periods, who is in each group,
whether answers are shared, and the accountant: the facts an owner checks before
changing a budget. All of it is the policy as the console read it at its start,
which is what the gate serves if both were started on the same file.
"""

from __future__ import annotations

from datetime import datetime

from dpmagic.gate.console.layout import Frame, esc, number, page, table, when
from dpmagic.gate.policy import Budget, Dataset, Policy


def overview_page(frame: Frame, policy: Policy, read_at: datetime) -> str:
    parts = [
        f'<p class="note">The policy {esc(policy.path)}, read at {esc(when(read_at))} UTC, '
        f"with the gate's state in {esc(policy.gate.state_dir)}. A change to the file "
        "takes effect when the gate (and this console) restart.</p>"
    ]
    for name in sorted(policy.datasets):
        parts.append(_dataset(policy, policy.datasets[name]))
    if policy.groups:
        rows = [
            [esc(group), esc(", ".join(sorted(members)) or "(nobody)")]
            for group, members in sorted(policy.groups.items())
        ]
        parts.append("<h2>Groups</h2>" + table(["group", "members"], rows))
    return page(frame, "", "Overview", "".join(parts))


def _dataset(policy: Policy, ds: Dataset) -> str:
    facts = [
        ["accountant", esc(ds.accountant.value)],
        ["neighbouring datasets", esc(ds.neighbouring.value)],
        ["privacy unit", esc(ds.privacy_unit or "each row")],
        ["engine", esc(ds.engine.value)],
        [
            "tables",
            esc(
                ", ".join(
                    f"{t.name} ({'public' if t.public else 'private'})" for t in ds.tables.values()
                )
            ),
        ],
        ["answers shared with other users", esc(ds.share_releases.value)],
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
            esc(label),
            number(limit.epsilon),
            number(limit.delta),
            esc(limit.renew.value if limit.renew else "never"),
        ]
        for label, limit in budgets
    ]
    return (
        f"<h2>Dataset {esc(ds.name)}</h2>"
        + table(["policy", "in force"], facts)
        + table(["budget", "ε", "δ", "renews"], rows, numeric={1, 2})
    )
