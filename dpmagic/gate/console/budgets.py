"""The budgets page: every budget's standing (``owner.standings``, the numbers
``dpmagic budget show`` prints) with a bar each, and charts of spending over time:
all users' on each dataset, and one selected budget's (``owner.spending``).

Here the page's text is gathered; ``templates/budgets.html`` draws it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from dpmagic.gate import owner
from dpmagic.gate.console.charts import Bar, Chart, bar, spending_chart
from dpmagic.gate.console.layout import Frame, Table, number, page, url
from dpmagic.gate.ledger.scopes import Scope, ScopeKind
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Policy
from dpmagic.gate.policy.values import AccountantKind


@dataclass(frozen=True)
class BudgetRow:
    """One budget's standing: who holds it, its amounts (ε, and δ if the accountant
    has one), its bar, its renewal and the links to its chart and to changing it."""

    kind: str
    holder: str
    notebook: str
    amounts: list[str]
    bar: Bar
    renews: str
    chart: str
    change: str


@dataclass(frozen=True)
class Preview:
    """What the budget left allows on a dataset (``owner.preview``)."""

    dataset: str
    against: str
    means: str
    accuracy: str
    table: Table


@dataclass(frozen=True)
class DatasetView:
    """A dataset's part of the page: all users' spending, its budgets' standings (the
    table's heads, one row each) and the preview."""

    name: str
    label: str
    chart: Chart | None
    heads: list[str]
    budgets: list[BudgetRow]
    preview: Preview


def budgets_page(
    frame: Frame,
    policy: Policy,
    ledger: Ledger | None,
    datasets: list[str],
    selected: Scope | None,
    accuracy: float | None = None,
) -> str:
    choose = _choose(frame, policy)
    if ledger is None:  # nothing spent yet: what the budgets allow
        previews = [_preview(policy, None, name, accuracy) for name in datasets]
        return page(frame, "budgets", "budgets.html", choose=choose, previews=previews, views=None)
    chosen = None
    if selected is not None:
        spent = owner.spending(policy, ledger, selected)
        chosen = (selected.describe(), spending_chart(spent, selected.describe()))
    found = owner.standings(policy, ledger, datasets, None)
    views = []
    for name in datasets:
        ds = policy.datasets[name]
        label = "all users' spending" + (
            " under the dataset budget" if ds.dataset_budget else " (no dataset budget)"
        )
        spent = owner.spending(policy, ledger, Scope.whole(name))
        with_delta = ds.accountant != AccountantKind.PURE
        views.append(
            DatasetView(
                name,
                label.capitalize(),
                spending_chart(spent, f"{name}: {label}"),
                _heads(with_delta),
                [_row(frame, s, with_delta) for s in found if s.scope.dataset == name],
                _preview(policy, ledger, name, accuracy),
            )
        )
    return page(frame, "budgets", "budgets.html", choose=choose, selected=chosen, views=views)


def _choose(frame: Frame, policy: Policy) -> list[tuple[str, str]]:
    """Links to each dataset's budgets alone, or all of them (none for one dataset)."""
    if len(policy.datasets) < 2:
        return []
    return [(url(frame.base, "budgets"), "all datasets")] + [
        (url(frame.base, "budgets", dataset=n), n) for n in sorted(policy.datasets)
    ]


def _heads(with_delta: bool) -> list[str]:
    heads = ["budget", "group or user", "notebook", "spent ε", "limit ε", "remaining ε"]
    if with_delta:
        heads += ["spent δ", "limit δ", "remaining δ"]
    return [*heads, "spent of limit", "renews", ""]


def _row(frame: Frame, s: owner.Standing, with_delta: bool) -> BudgetRow:
    scope = s.scope
    names = {
        "dataset": scope.dataset,
        "budget": scope.kind.value,
        "holder": scope.holder,
        "notebook": scope.notebook if scope.kind == ScopeKind.NOTEBOOK else "",
    }
    amounts = [s.spent.epsilon, s.limit.epsilon, s.remaining.epsilon]
    if with_delta:
        amounts += [s.spent.delta, s.limit.delta, s.remaining.delta]
    return BudgetRow(
        kind=scope.kind.value,
        holder=scope.holder,
        notebook=names["notebook"] or (owner.ALL_NOTEBOOKS if scope.kind == ScopeKind.USER else ""),
        amounts=[number(a) for a in amounts],
        bar=bar(s.spent.epsilon, s.limit.epsilon),
        renews=s.renew.value if s.renew else "",
        chart=url(frame.base, "budgets", **names),
        change=url(frame.base, "change", **names),
    )


def _preview(policy: Policy, ledger: Ledger | None, name: str, accuracy: float | None) -> Preview:
    """What the budget left allows (``owner.preview``): per kind of query, the ε to ask
    with, its ± at 95% and how many more fit, at the dataset's default ε and, when the
    page was asked with ``accuracy``, at that accuracy."""
    found = owner.preview(policy, ledger, name, accuracy)
    against = "the dataset budget left" if found["against"] == "dataset" else "a new user's budgets"
    heads = ["query", "asked with", "cost ε", "± at 95%", "more that fit"]
    rows = []
    # The preview's JSON, as ``%dpbudget`` reads it: a list of each kind's dict.
    kinds = cast(list[dict[str, Any]], found["kinds"])
    for kind in kinds:
        what = "count" if kind["kind"] == "count" else f"mean of {kind['column']}"
        what += f" ({kind['table']})"
        for key in ("at_accuracy", "at_default"):
            option = kind.get(key)
            if not option:
                continue
            if "refused" in option:
                rows.append([what, "refused: " + option["refused"], "", "", ""])
                continue
            ask = option["ask"]
            asked = f"± {ask['accuracy']:g}" if "accuracy" in ask else f"ε {ask['epsilon']:g}"
            rows.append([
                what,
                asked,
                number(option["cost"]["epsilon"]),
                number(option["half_width"]),
                str(option["fits"]),
            ])  # fmt: skip
    return Preview(
        dataset=name,
        against=against,
        means=f"means over {found['rows']} rows",
        accuracy="" if accuracy is None else f"{accuracy:g}",
        table=Table(heads, rows, frozenset({2, 3, 4})),
    )
