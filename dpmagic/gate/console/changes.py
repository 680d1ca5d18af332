"""The change page: grant to or reset any budget (a dataset's, a group's, a user's or a
notebook's), with a reason the audit log keeps.

The form's fields become the change through ``gate/owner.py`` exactly as the CLI's
options do (``scope_named`` → ``scope_of``, ``amount``, ``grant``/``reset``), and
``owner.apply`` writes it; so a change made here is the same row in the log as the
same change made with ``dpmagic budget``, but for its author's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dpmagic.gate import owner
from dpmagic.gate.console.layout import Frame, esc, page
from dpmagic.gate.policy import Budget, Policy
from dpmagic.gate.service.budget_scopes import ScopeKind

FIELDS = ("dataset", "budget", "holder", "notebook", "epsilon", "delta", "reason")


@dataclass(frozen=True)
class ChangeForm:
    """The change form's fields as typed (all text: ``change`` checks them)."""

    dataset: str = ""
    budget: str = ScopeKind.USER.value
    holder: str = ""
    notebook: str = ""
    epsilon: str = ""
    delta: str = ""
    reason: str = ""

    @classmethod
    def read(cls, field: Callable[[str], str | None]) -> ChangeForm:
        """The form from a request's arguments (``field(name)``; missing ones default)."""
        given = {name: value for name in FIELDS if (value := field(name)) is not None}
        return cls(**given)

    def change(self, policy: Policy, action: str, by: str) -> owner.Change:
        """The grant or reset these fields ask for, checked as the CLI checks its own."""
        scope = owner.scope_named(
            policy, self.dataset or None, self.budget, self.holder, self.notebook
        )
        if action == "grant":
            amount = Budget(owner.amount(self.epsilon), owner.amount(self.delta))
            return owner.grant(scope, amount, by, self.reason)
        return owner.reset(scope, by, self.reason)


def change_page(frame: Frame, policy: Policy, form: ChangeForm, error: str | None = None) -> str:
    datasets = "".join(
        f'<option value="{esc(n)}"{" selected" if n == form.dataset else ""}>{esc(n)}</option>'
        for n in sorted(policy.datasets)
    )
    kinds = "".join(
        f'<option value="{k.value}"{" selected" if k.value == form.budget else ""}>'
        f"{esc(label)}</option>"
        for k, label in (
            (ScopeKind.USER, "a user's"),
            (ScopeKind.NOTEBOOK, "a user's notebook's"),
            (ScopeKind.GROUP, "a group's"),
            (ScopeKind.DATASET, "the dataset's (all users together)"),
        )
    )
    groups = "".join(
        f'<option value="{esc(g)}">'
        for g in sorted({g for ds in policy.datasets.values() for g in ds.group_budgets})
    )
    problem = f'<p class="error">{esc(error)}</p>' if error else ""
    body = (
        '<p class="note">A grant raises a budget\'s limit by (ε, δ); a reset starts its '
        "spending (and its grants) from zero; answers already released stay replayable "
        "at no cost. Both are written to the audit log with your name and your reason, "
        "as <code>dpmagic budget grant|reset</code> writes them.</p>"
        f"{problem}"
        f'<form class="change" method="post" action="{esc(frame.base)}grant">'
        f"{frame.csrf_field()}"
        f'<label>dataset<select name="dataset">{datasets}</select></label>'
        f'<label>budget<select name="budget">{kinds}</select></label>'
        f'<label>user or group<input name="holder" list="groups" value="{esc(form.holder)}">'
        f'</label><datalist id="groups">{groups}</datalist>'
        f'<label>notebook (a notebook\'s budget)<input name="notebook" '
        f'value="{esc(form.notebook)}"></label>'
        f'<label>ε to grant<input name="epsilon" inputmode="decimal" '
        f'value="{esc(form.epsilon)}"></label>'
        f'<label>δ to grant<input name="delta" inputmode="decimal" value="{esc(form.delta)}">'
        "</label>"
        f'<label class="wide">reason (for the audit log)<textarea name="reason" rows="2" '
        f"required>{esc(form.reason)}</textarea></label>"
        f'<div class="wide"><button formaction="{esc(frame.base)}grant">Grant</button> '
        f'<button formaction="{esc(frame.base)}reset">Reset</button></div>'
        "</form>"
    )
    return page(frame, "change", "Change a budget", body)
