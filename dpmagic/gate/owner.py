"""What the data's owner can read and do: every budget's standing and its spending
over time, the query log, the renewing budgets, and the changes to budgets (grants
and resets), each with its reason.

One implementation, which ``dpmagic budget``/``dpmagic audit`` and the owner's
console (``dpmagic console``) both call, so the terminal and the web page can
never disagree on what a budget is or how a change is logged. It runs as the
gate's own Unix user, on the gate's ledger file: it refuses another user's ledger
(files SQLite creates beside it would be the caller's, and the gate could no longer
open them). Nothing here reads private data or a stored answer.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import math
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from dpmagic.gate.dp.accounting import Cost, make_accountant
from dpmagic.gate.failures import OwnerError
from dpmagic.gate.ledger.scopes import (
    ADMIN,
    CHARGED,
    FAILED,
    GRANTED,
    GROUP_SEPARATOR,
    REFUSED,
    RELEASED,
    RENEWED,
    RENEWS,
    REPLAYED,
    RESET,
    WHOLE_USER,
    Scope,
    ScopeKind,
    admin_target,
    next_period,
    period_label,
)
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Budget, Dataset, Policy
from dpmagic.gate.policy.values import AccountantKind, Period

if TYPE_CHECKING:
    import sqlite3

LEDGER_FILE = "ledger.sqlite3"
ALL_NOTEBOOKS = "(all notebooks)"
# The audit columns a terminal shows, the long SQL last.
AUDIT_COLUMNS = ("id", "time", "user", "dataset", "notebook", "epsilon", "status", "sql")
# Every status a log row may have, queries' first, then the owner's and the renewals'.
STATUSES = (CHARGED, RELEASED, FAILED, REPLAYED, REFUSED, GRANTED, RESET, RENEWS, RENEWED)
# The renewal rows shown per renewing budget, newest first.
RENEWAL_ROWS = 50


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


def operator() -> str:
    """Who runs the CLI, or the console by its printed login URL: the gate's Unix user,
    as the audit log names whoever changed a budget."""
    return getpass.getuser()


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


def scope_named(
    policy: Policy, dataset: str | None, budget: str, holder: str = "", notebook: str = ""
) -> Scope:
    """The budget a form names by its kind (``dataset``, ``group``, ``user`` or
    ``notebook``) and holder, checked as ``scope_of`` checks the CLI's options."""
    holder, notebook = holder.strip(), notebook.strip()
    if budget == ScopeKind.DATASET:
        return scope_of(policy, dataset, whole=True)
    if budget == ScopeKind.GROUP:
        return scope_of(policy, dataset, group=holder)
    if budget == ScopeKind.USER:
        return scope_of(policy, dataset, user=holder)
    if budget == ScopeKind.NOTEBOOK:
        if not notebook:
            raise OwnerError("name the notebook whose budget changes")
        return scope_of(policy, dataset, user=holder, notebook=notebook)
    raise OwnerError(f"no such budget: {budget!r} (dataset, group, user or notebook)")


def amount(text: str) -> float:
    """An ε or δ an owner typed: a finite number ≥ 0 (empty: 0)."""
    try:
        value = float(text) if text.strip() else 0.0
    except ValueError:
        raise OwnerError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise OwnerError(f"must be a finite number ≥ 0: {text!r}")
    return value


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
    seen: dict[str, list[str]] = {}
    for who, notebook in ledger.notebooks(ds.name, user):
        notebooks = seen.setdefault(who, [])
        if notebook != WHOLE_USER:
            notebooks.append(notebook)
    for who, notebooks in seen.items():
        found.append(Scope.user(ds.name, who))
        found += [Scope.of_notebook(ds.name, who, nb) for nb in notebooks]
    return found


@dataclass(frozen=True)
class Standing:
    """One budget's standing as the accountant shows it: spent, limit (with grants) and
    remaining in (ε, δ), ρ too under zCDP, and the policy's renewal period if any."""

    scope: Scope
    accountant: AccountantKind
    spent: Budget
    limit: Budget
    remaining: Budget
    spent_rho: float | None
    remaining_rho: float | None
    renew: Period | None

    def row(self) -> dict[str, object]:
        """The row ``dpmagic budget show`` prints (δ where the accountant has one)."""
        scope = self.scope
        row: dict[str, object] = {
            "dataset": scope.dataset,
            "budget": scope.kind.value,
            "user": scope.holder if scope.kind != ScopeKind.GROUP else "",
            "group": scope.holder if scope.kind == ScopeKind.GROUP else "",
            "notebook": scope.notebook
            if scope.kind == ScopeKind.NOTEBOOK
            else (ALL_NOTEBOOKS if scope.kind == ScopeKind.USER else ""),
            "spent_epsilon": self.spent.epsilon,
            "limit_epsilon": self.limit.epsilon,
            "remaining_epsilon": self.remaining.epsilon,
        }
        if self.accountant != AccountantKind.PURE:
            row.update(
                spent_delta=self.spent.delta,
                limit_delta=self.limit.delta,
                remaining_delta=self.remaining.delta,
            )
        if self.spent_rho is not None:
            row.update(spent_rho=self.spent_rho, remaining_rho=self.remaining_rho)
        row["renews"] = self.renew.value if self.renew is not None else ""
        return row


def standings(
    policy: Policy, ledger: Ledger | None, datasets: list[str], user: str | None
) -> list[Standing]:
    """Every budget (dataset, group, user, notebook) of each dataset: what it spent, its
    limit with grants, what is left, and its renewal period if any."""
    if ledger is None:
        return []
    found: list[Standing] = []
    for name in datasets:
        ds = policy.datasets[name]
        accountant = make_accountant(ds.accountant)
        budgets = scopes(ledger, ds, user)
        standing = ledger.standing([(s, base_limit(ds, s)) for s in budgets])
        for scope, (spent, limit) in zip(budgets, standing, strict=True):
            view = accountant.view(spent, limit)
            used, left = view["spent"], view["remaining"]
            found.append(
                Standing(
                    scope=scope,
                    accountant=ds.accountant,
                    spent=Budget(used["epsilon"], used["delta"]),
                    limit=limit,
                    remaining=Budget(left["epsilon"], left["delta"]),
                    spent_rho=used.get("rho"),
                    remaining_rho=left.get("rho"),
                    renew=base_limit(ds, scope).renew,
                )
            )
    return found


def budget_rows(
    policy: Policy, ledger: Ledger | None, datasets: list[str], user: str | None
) -> list[dict[str, object]]:
    """``standings`` as the rows ``dpmagic budget show`` prints."""
    return [s.row() for s in standings(policy, ledger, datasets, user)]


@dataclass(frozen=True)
class Point:
    """A budget's spending (ε, as its accountant shows it) and its limit's ε from a time
    on; the limit is None for a dataset without a dataset budget."""

    time: datetime
    spent: float
    limit: float | None


def spending(policy: Policy, ledger: Ledger, scope: Scope) -> list[Point]:
    """How ``scope``'s spending and limit went over time (``Ledger.timeline``), ending
    now with its standing (a renewing budget whose period ended reads as renewed).
    A dataset's whole spending is drawn also where it has no dataset budget: then as
    its charges' ε added up, there being no limit to show it against."""
    ds = policy.dataset(scope.dataset)
    accountant = make_accountant(ds.accountant)
    capped = scope.kind != ScopeKind.DATASET or ds.dataset_budget is not None
    base = base_limit(ds, scope) if capped else Budget(0.0)
    steps = [(datetime.fromisoformat(t), c, b) for t, c, b in ledger.timeline(scope, base)]
    [(spent, limit)] = ledger.standing([(scope, base)])
    steps.append((ledger.now(), spent, limit))
    if not capped:
        return [Point(when, cost.epsilon, None) for when, cost, _ in steps]
    return [
        Point(when, accountant.view(cost, cap)["spent"]["epsilon"], cap.epsilon)
        for when, cost, cap in steps
    ]


@dataclass(frozen=True)
class LogFilter:
    """Which log rows to read: each field narrows (None: any), ``text`` is found in the
    SQL (or an owner's note) whatever its case, ``limit`` the newest rows kept (None:
    all)."""

    user: str | None = None
    notebook: str | None = None
    status: str | None = None
    text: str | None = None
    limit: int | None = 50


@dataclass(frozen=True)
class LogEntry:
    """One row of the audit log (never its stored answer): a query's charge, release,
    failure, replay or refusal before the debit (``reason``: what its user was told),
    or a grant, reset or renewal of a budget (``target``)."""

    id: int
    time: datetime
    user: str
    dataset: str
    notebook: str
    sql: str
    epsilon: float
    delta: float
    rho: float
    status: str
    groups: tuple[str, ...]
    source: int | None  # a shared replay: the release it served
    target: Scope | None  # an admin row: the budget it was written for
    reason: str | None = None  # a refusal: why

    @property
    def replayed(self) -> bool:
        return self.status == REPLAYED

    def row(self) -> dict[str, object]:
        """The row ``dpmagic audit --json`` prints."""
        return {
            "id": self.id,
            "time": self.time.isoformat(timespec="microseconds"),
            "user": self.user,
            "dataset": self.dataset,
            "notebook": self.notebook,
            "sql": self.sql,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho": self.rho,
            "status": self.status,
            "scope": self.target.row_columns()[0] if self.target is not None else "",
            "source": self.source,
            "groups": list(self.groups),
            "replayed": self.replayed,
            "reason": self.reason,
        }


def log(ledger: Ledger | None, datasets: list[str], which: LogFilter) -> list[LogEntry]:
    """The ledger's history, newest first, across the chosen datasets, as ``which``
    narrows it; never a stored answer (``Ledger.history`` reads none)."""
    if ledger is None:
        return []
    needle = (which.text or "").casefold()
    found: list[LogEntry] = []
    for name in datasets:
        rows = ledger.history(
            user=which.user,
            dataset=name,
            notebook=which.notebook,
            status=which.status,
            limit=None if needle else which.limit,
        )
        found += [
            _entry(r)
            for r in rows
            if needle in str(r["sql"]).casefold() or needle in str(r["reason"] or "").casefold()
        ]
    found.sort(key=lambda e: e.id, reverse=True)
    return found[: which.limit]


def _entry(row: dict[str, object]) -> LogEntry:
    """A history row (``Ledger.history``) as typed."""

    def number(key: str) -> float:
        value = row[key]
        assert isinstance(value, int | float)
        return float(value)

    groups, source, dataset = row["groups"], row["source"], str(row["dataset"])
    assert isinstance(groups, list) and (source is None or isinstance(source, int))
    target = None
    if row["status"] in ADMIN:
        # ``admin_target`` reads a row by its columns' names, which a history row keeps.
        columns = cast("sqlite3.Row", {**row, "groups": GROUP_SEPARATOR.join(groups)})
        target = admin_target(columns, dataset)
    return LogEntry(
        id=int(number("id")),
        time=datetime.fromisoformat(str(row["time"])),
        user=str(row["user"]),
        dataset=dataset,
        notebook=str(row["notebook"]),
        sql=str(row["sql"]),
        epsilon=number("epsilon"),
        delta=number("delta"),
        rho=number("rho"),
        status=str(row["status"]),
        groups=tuple(groups),
        source=source,
        target=target,
        reason=None if row["reason"] is None else str(row["reason"]),
    )


def audit_rows(
    ledger: Ledger | None,
    datasets: list[str],
    user: str | None,
    limit: int,
    notebook: str | None = None,
    status: str | None = None,
) -> list[dict[str, object]]:
    """``log`` as the rows ``dpmagic audit`` prints."""
    which = LogFilter(user=user, notebook=notebook, status=status, limit=limit)
    return [e.row() for e in log(ledger, datasets, which)]


@dataclass(frozen=True)
class Renewal:
    """A renewing budget of the policy (the dataset's, a group's, each user's or each
    notebook's): its limit and period, the period now and when the next begins (at
    the first charge after it), and its renewal rows, newest first."""

    dataset: str
    kind: ScopeKind
    group: str
    limit: Budget
    period: Period
    current: str
    next_begins: datetime
    history: list[LogEntry]


def renewals(policy: Policy, ledger: Ledger | None) -> list[Renewal]:
    """Every renewing budget of the policy, with its renewal rows from the ledger."""
    when = ledger.now() if ledger is not None else datetime.now(UTC)
    found: list[Renewal] = []
    for ds in sorted(policy.datasets.values(), key=lambda d: d.name):
        budgets: list[tuple[ScopeKind, str, Budget]] = []
        if ds.dataset_budget is not None:
            budgets.append((ScopeKind.DATASET, "", ds.dataset_budget))
        budgets += [(ScopeKind.GROUP, g, b) for g, b in sorted(ds.group_budgets.items())]
        budgets += [
            (ScopeKind.USER, "", ds.user_budget),
            (ScopeKind.NOTEBOOK, "", ds.notebook_budget),
        ]
        rows = [
            e
            for status in (RENEWS, RENEWED)
            for e in log(ledger, [ds.name], LogFilter(status=status, limit=None))
        ]
        rows.sort(key=lambda e: e.id, reverse=True)
        for kind, group, limit in budgets:
            if limit.renew is None:
                continue
            mine = [
                e
                for e in rows
                if e.target is not None
                and e.target.kind == kind
                and (kind != ScopeKind.GROUP or e.target.holder == group)
            ]
            found.append(
                Renewal(
                    dataset=ds.name,
                    kind=kind,
                    group=group,
                    limit=limit,
                    period=limit.renew,
                    current=period_label(limit.renew, when),
                    next_begins=datetime.fromisoformat(next_period(limit.renew, when)),
                    history=mine[:RENEWAL_ROWS],
                )
            )
    return found


def preview(
    policy: Policy, ledger: Ledger | None, dataset: str, accuracy: float | None = None
) -> dict[str, object]:
    """What the budget left allows, for the owner: the utility preview users get from
    ``%dpbudget`` (``gate/preview.py``: each kind of query planned as the gate plans
    it, counted by the accountant), against the dataset's own budget as it stands, or,
    where the policy sets none, against a new user's budgets (the user's and a
    notebook's, unspent). Planned from the policy alone: the preview's kinds read only
    private tables, whose plans need none of the public tables' facts a gate reads at
    its start."""
    # The planner's modules load here, not with the CLI's budget commands.
    from dpmagic.gate.engine import plan_request
    from dpmagic.gate.preview import PreviewRequest, utility_preview

    ds = policy.datasets[dataset]
    accountant = make_accountant(ds.accountant)
    if ds.dataset_budget is not None:
        whole = [(Scope.whole(ds.name), ds.dataset_budget)]
        standing = (
            ledger.standing(whole) if ledger is not None else [(Cost(0.0), ds.dataset_budget)]
        )
    else:
        standing = [(Cost(0.0), ds.user_budget), (Cost(0.0), ds.notebook_budget)]
    plan = functools.partial(plan_request, ds, accountant)
    found = utility_preview(ds, accountant, plan, standing, PreviewRequest(accuracy=accuracy))
    return {**found, "against": "dataset" if ds.dataset_budget is not None else "new user"}
