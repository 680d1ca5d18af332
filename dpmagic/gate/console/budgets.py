"""The budgets page: every budget's standing (``owner.standings``, the numbers
``dpmagic budget show`` prints) with a bar each, and charts of spending over time:
all users' on each dataset, and one selected budget's (``owner.spending``)."""

from __future__ import annotations

from dpmagic.gate import owner
from dpmagic.gate.console.charts import bar, spending_chart
from dpmagic.gate.console.layout import Frame, esc, number, page, table, url
from dpmagic.gate.policy import Policy
from dpmagic.gate.policy.values import AccountantKind
from dpmagic.gate.service.budget_scopes import Scope, ScopeKind
from dpmagic.gate.service.ledger import Ledger


def budgets_page(
    frame: Frame,
    policy: Policy,
    ledger: Ledger | None,
    datasets: list[str],
    selected: Scope | None,
    accuracy: float | None = None,
) -> str:
    parts = [_choose(frame, policy, datasets)]
    if ledger is None:
        parts.append('<p class="note">No query has been recorded yet.</p>')
        parts += [_preview(frame, policy, None, name, accuracy) for name in datasets]
        return page(frame, "budgets", "Budgets", "".join(parts))
    if selected is not None:
        parts.append(
            f"<h2>Spending of {esc(selected.describe())}</h2>"
            + spending_chart(owner.spending(policy, ledger, selected), selected.describe())
        )
    found = owner.standings(policy, ledger, datasets, None)
    for name in datasets:
        ds = policy.datasets[name]
        whole = Scope.whole(name)
        label = "all users' spending" + (
            " under the dataset budget" if ds.dataset_budget else " (no dataset budget)"
        )
        mine = [s for s in found if s.scope.dataset == name]
        parts.append(
            f"<h2>Dataset {esc(name)}</h2><p>{esc(label.capitalize())}</p>"
            + spending_chart(owner.spending(policy, ledger, whole), f"{name}: {label}")
            + (_table(frame, mine, ds.accountant) if mine else "<p>No budget used yet.</p>")
            + _preview(frame, policy, ledger, name, accuracy)
        )
    return page(frame, "budgets", "Budgets", "".join(parts))


def _choose(frame: Frame, policy: Policy, datasets: list[str]) -> str:
    """Links to each dataset's budgets alone, or all of them."""
    if len(policy.datasets) < 2:
        return ""
    links = [f'<a href="{esc(url(frame.base, "budgets"))}">all datasets</a>'] + [
        f'<a href="{esc(url(frame.base, "budgets", dataset=n))}">{esc(n)}</a>'
        for n in sorted(policy.datasets)
    ]
    return "<p>Show: " + " · ".join(links) + "</p>"


def _table(frame: Frame, standings: list[owner.Standing], accountant: AccountantKind) -> str:
    with_delta = accountant != AccountantKind.PURE
    heads = ["budget", "group or user", "notebook", "spent ε", "limit ε", "remaining ε"]
    if with_delta:
        heads += ["spent δ", "limit δ", "remaining δ"]
    heads += ["spent of limit", "renews", ""]
    numeric = set(range(3, 9 if with_delta else 6))
    rows = []
    for s in standings:
        scope = s.scope
        names = {
            "dataset": scope.dataset,
            "budget": scope.kind.value,
            "holder": scope.holder,
            "notebook": scope.notebook if scope.kind == ScopeKind.NOTEBOOK else "",
        }
        row = [
            esc(scope.kind.value),
            esc(scope.holder),
            esc(names["notebook"] or (owner.ALL_NOTEBOOKS if scope.kind == ScopeKind.USER else "")),
            number(s.spent.epsilon),
            number(s.limit.epsilon),
            number(s.remaining.epsilon),
        ]
        if with_delta:
            row += [number(s.spent.delta), number(s.limit.delta), number(s.remaining.delta)]
        row += [
            bar(s.spent.epsilon, s.limit.epsilon),
            esc(s.renew.value if s.renew else ""),
            f'<a href="{esc(url(frame.base, "budgets", **names))}">chart</a> · '
            f'<a href="{esc(url(frame.base, "change", **names))}">grant or reset</a>',
        ]
        rows.append(row)
    return table(heads, rows, numeric=numeric)


def _preview(
    frame: Frame, policy: Policy, ledger: Ledger | None, name: str, accuracy: float | None
) -> str:
    """What the budget left allows (``owner.preview``): per kind of query, the ε to ask
    with, its ± at 95% and how many more fit, at the dataset's default ε and, when the
    page was asked with ``accuracy``, at that accuracy."""
    found = owner.preview(policy, ledger, name, accuracy)
    against = "the dataset budget left" if found["against"] == "dataset" else "a new user's budgets"
    heads = ["query", "asked with", "cost ε", "± at 95%", "more that fit"]
    rows = []
    for kind in found["kinds"]:  # type: ignore[union-attr]
        what = "count" if kind["kind"] == "count" else f"mean of {kind['column']}"
        what += f" ({kind['table']})"
        for key in ("at_accuracy", "at_default"):
            option = kind.get(key)
            if not option:
                continue
            if "refused" in option:
                rows.append([esc(what), esc("refused: " + option["refused"]), "", "", ""])
                continue
            ask = option["ask"]
            asked = f"± {ask['accuracy']:g}" if "accuracy" in ask else f"ε {ask['epsilon']:g}"
            rows.append([
                esc(what),
                esc(asked),
                number(option["cost"]["epsilon"]),
                number(option["half_width"]),
                esc(str(option["fits"])),
            ])  # fmt: skip
    form = (
        f'<form method="get" action="{esc(url(frame.base, "budgets"))}">'
        f'<input type="hidden" name="dataset" value="{esc(name)}">'
        '<label>at an accuracy of ± <input name="accuracy" size="6"'
        f' value="{esc("" if accuracy is None else f"{accuracy:g}")}"></label> '
        '<button type="submit">Preview</button></form>'
    )
    means = f"means over {found['rows']} rows"
    return (
        f"<h3>What {esc(against)} allows on {esc(name)}</h3>"
        f"<p>Each kind of query planned as the gate plans it ({esc(means)}); nothing is "
        "charged or read.</p>" + form + table(heads, rows, numeric={2, 3, 4})
    )
