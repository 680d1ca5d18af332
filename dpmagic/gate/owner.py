"""What the data's owner can read and do: every budget's standing, the query log,
and the changes to budgets (grants and resets), each with its reason.

One implementation, which ``dpmagic budget``/``dpmagic audit`` and the owner's
console (``dpmagic console``) both call, so the terminal and the web page can
never disagree on what a budget is or how a change is logged. It runs as the
gate's own Unix user, on the gate's ledger file: it refuses another user's ledger
(files SQLite creates beside it would be the caller's, and the gate could no longer
open them). Nothing here reads private data or a stored answer.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.failures import OwnerError
from dpmagic.gate.policy import Budget, Dataset, Policy
from dpmagic.gate.service.budget_scopes import WHOLE_USER, Scope, ScopeKind
from dpmagic.gate.service.ledger import Ledger

LEDGER_FILE = "ledger.sqlite3"
ALL_NOTEBOOKS = "(all notebooks)"
# The audit columns a terminal shows, the long SQL last.
AUDIT_COLUMNS = ("id", "time", "user", "dataset", "notebook", "status", "epsilon", "sql")


@dataclass(frozen=True)
class Change:
    """A budget change as the audit log records it: what, to which budget, by whom, why."""

    action: str  # "grant" or "reset"
    scope: Scope
    by: str
    reason: str
    amount: Budget | None = None

    def note(self) -> str:
        return f"budget {self.action} by {self.by}: {self.reason}"

    def describe(self) -> str:
        """What was done, for the terminal and the console's confirmation."""
        if self.action == "grant" and self.amount is not None:
            delta = f", δ={self.amount.delta:g}" if self.amount.delta else ""
            return f"granted ε={self.amount.epsilon:g}{delta} to {self.scope.describe()}"
        return f"reset {self.scope.describe()}"


@contextlib.contextmanager
def open_ledger(policy: Policy, create: bool = False) -> Iterator[Ledger | None]:
    """The gate's ledger, or None if no query was ever recorded (created only if asked)."""
    path = policy.gate.state_dir / LEDGER_FILE
    if not path.exists() and not create:
        yield None
        return
    check_owner(path if path.exists() else policy.gate.state_dir)
    ledger = Ledger(path, make_accountant(policy.gate.accountant))
    try:
        yield ledger
    finally:
        ledger.close()


def check_owner(path: os.PathLike[str] | str) -> None:
    """Refuse to touch a ledger (or state folder) that is not the caller's."""
    if not os.path.exists(path):
        return
    owner = os.stat(path).st_uid
    if owner != os.getuid():
        name = user_name(owner)
        raise OwnerError(
            f"the ledger belongs to user {name}: run this as that user (sudo -u {name} dpmagic …)"
        )


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def scope_of(
    policy: Policy,
    dataset: str | None,
    *,
    user: str | None = None,
    notebook: str | None = None,
    group: str | None = None,
    whole: bool = False,
) -> Scope:
    """The budget an owner names: the dataset's (``whole``), a group's, a user's or one
    of a user's notebooks. Exactly one holder; a notebook goes with its user."""
    ds = policy.dataset(dataset)
    named = [x for x in (user is not None, group is not None, whole) if x]
    if len(named) != 1:
        raise OwnerError("name one budget: a user (and notebook), a group, or the whole dataset")
    if notebook is not None and user is None:
        raise OwnerError("a notebook's budget is a user's: name the user too")
    if whole:
        if ds.dataset_budget is None:
            raise OwnerError(
                f"dataset {ds.name!r} has no dataset_budget in the policy; set one to grant or "
                "reset it"
            )
        return Scope.whole(ds.name)
    if group is not None:
        if group not in ds.group_budgets:
            known = ", ".join(sorted(ds.group_budgets)) or "none"
            raise OwnerError(
                f"group {group!r} has no budget on dataset {ds.name!r} (group budgets: {known})"
            )
        return Scope.group(ds.name, group)
    assert user is not None
    if not user:
        raise OwnerError("a user's name cannot be empty")
    if notebook is None:
        return Scope.user(ds.name, user)
    return Scope.of_notebook(ds.name, user, notebook)


def grant(scope: Scope, amount: Budget, by: str, reason: str) -> Change:
    """A grant raising ``scope``'s limit by ``amount``, checked before anything is
    opened or written (``apply`` writes it)."""
    if not (amount.epsilon > 0 or amount.delta > 0):
        raise OwnerError("a grant needs an ε or a δ above 0")
    return Change("grant", scope, by, _reason(reason), amount)


def reset(scope: Scope, by: str, reason: str) -> Change:
    """A reset starting ``scope``'s spending (and grants) from zero. Released answers
    stay replayable: they were already paid for."""
    return Change("reset", scope, by, _reason(reason))


def apply(ledger: Ledger, change: Change) -> None:
    """Write ``change`` to the audit log, where it takes effect."""
    if change.action == "grant":
        assert change.amount is not None
        ledger.grant(change.scope, change.amount, change.note())
    else:
        ledger.reset(change.scope, change.note())


def _reason(text: str) -> str:
    reason = " ".join(text.split())
    if not reason:
        raise OwnerError("say why (a reason), for the audit log")
    return reason


def base_limit(ds: Dataset, scope: Scope) -> Budget:
    """A scope's limit in the policy, before grants."""
    if scope.kind == ScopeKind.DATASET:
        assert ds.dataset_budget is not None
        return ds.dataset_budget
    if scope.kind == ScopeKind.GROUP:
        return ds.group_budgets[scope.holder]
    return ds.user_budget if scope.kind == ScopeKind.USER else ds.notebook_budget


def scopes(ledger: Ledger, ds: Dataset, user: str | None = None) -> list[Scope]:
    """Every budget of ``ds`` worth showing: the dataset's and each group's (when set,
    and no single user asked for), and each user's and notebook's the log names."""
    found: list[Scope] = []
    if user is None:
        if ds.dataset_budget is not None:
            found.append(Scope.whole(ds.name))
        found += [Scope.group(ds.name, g) for g in sorted(ds.group_budgets)]
    seen: dict[str, set[str]] = {}
    for entry in ledger.history(user=user, dataset=ds.name):
        if entry["scope"]:  # a dataset's or a group's admin row
            continue
        notebooks = seen.setdefault(str(entry["user"]), set())
        if entry["notebook"] != WHOLE_USER:
            notebooks.add(str(entry["notebook"]))
    for who in sorted(seen):
        found.append(Scope.user(ds.name, who))
        found += [Scope.of_notebook(ds.name, who, nb) for nb in sorted(seen[who])]
    return found


def budget_rows(
    policy: Policy, ledger: Ledger | None, datasets: list[str], user: str | None
) -> list[dict[str, object]]:
    """One row per budget (dataset, group, user, notebook), for each dataset: what it
    spent, its limit with grants, what is left, and its renewal period if any."""
    if ledger is None:
        return []
    rows: list[dict[str, object]] = []
    for name in datasets:
        ds = policy.datasets[name]
        accountant = make_accountant(ds.accountant)
        found = scopes(ledger, ds, user)
        standing = ledger.standing([(s, base_limit(ds, s)) for s in found])
        for scope, (spent, limit) in zip(found, standing, strict=True):
            view = accountant.view(spent, limit)
            used, left = view["spent"], view["remaining"]
            row: dict[str, object] = {
                "dataset": name,
                "budget": scope.kind.value,
                "user": scope.holder if scope.kind != ScopeKind.GROUP else "",
                "group": scope.holder if scope.kind == ScopeKind.GROUP else "",
                "notebook": scope.notebook
                if scope.kind == ScopeKind.NOTEBOOK
                else (ALL_NOTEBOOKS if scope.kind == ScopeKind.USER else ""),
                "spent_epsilon": used["epsilon"],
                "limit_epsilon": limit.epsilon,
                "remaining_epsilon": left["epsilon"],
            }
            if ds.accountant != "pure":
                row.update(
                    spent_delta=used["delta"],
                    limit_delta=limit.delta,
                    remaining_delta=left["delta"],
                )
            if "rho" in used:
                row.update(spent_rho=used["rho"], remaining_rho=left["rho"])
            renew = base_limit(ds, scope).renew
            row["renews"] = renew.value if renew is not None else ""
            rows.append(row)
    return rows


def audit_rows(
    ledger: Ledger | None,
    datasets: list[str],
    user: str | None,
    limit: int,
    notebook: str | None = None,
    status: str | None = None,
) -> list[dict[str, object]]:
    """The ledger's history, newest first, across the chosen datasets; never a stored
    answer."""
    if ledger is None:
        return []
    rows = [
        dict(entry)
        for name in datasets
        for entry in ledger.history(
            user=user, dataset=name, notebook=notebook, status=status, limit=limit
        )
    ]
    rows.sort(key=lambda r: r["id"], reverse=True)
    return rows[:limit]
