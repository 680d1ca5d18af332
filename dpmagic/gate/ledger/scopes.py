"""Who a budget belongs to, and what each ledger row counts for it.

Four budgets can apply to one query, each over the spending of its own holder on
one dataset: the dataset's (every user's), a group's (its members' at the time of
each charge), a user's, and a notebook's. Every ledger row names the scopes it
counts for (``targets``), so the ledger's running tallies, a tally read afresh from
the whole log, and the owner's console all decide that in one place.

A renewing budget bounds what is spent within one period (a UTC day, ISO week or
calendar month). Its periods are ledger rows too: the first charge under a renewing
limit writes ``renews`` (the period it began in; nothing is given back), and the
first charge in each later period writes ``renewed`` (spending starts from zero).
So a renewal is never retroactive: spending before the renewal was configured, or
earlier in the current period, stays counted; and the log alone explains every
budget, renewals included.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from dpmagic.gate.dp.accounting import Composition, Cost
from dpmagic.gate.policy import Budget, Dataset
from dpmagic.gate.policy.values import Period
from dpmagic.protocol import BudgetName

CHARGED, RELEASED, FAILED, REPLAYED = "charged", "released", "failed", "replayed"
# A query refused before its debit (by the analysis, or over a budget): nothing
# charged, kept so the owner's log shows what was asked and why it was refused.
REFUSED = "refused"
# Admin actions, kept in the same log as the queries they affect.
GRANTED, RESET = "granted", "reset"
# A renewing budget's periods: the first one seen, and each later one begun.
RENEWS, RENEWED = "renews", "renewed"
ADMIN = (GRANTED, RESET, RENEWS, RENEWED)
# Statuses whose cost counts against budgets (``charged_to`` says which). A replay of
# the user's own release costs nothing (its row's cost is zero); a shared release
# served to a user who had not learned it is charged on its replay row, to the
# budgets that release did not yet count against (``Ledger.serve_shared``).
SPENDING = (CHARGED, RELEASED, FAILED, REPLAYED)
# The notebook column of a row that applies to a user as a whole (or to no user);
# never a real notebook name, as the gate names a nameless notebook "unnamed".
WHOLE_USER = ""
# Between group names in a row's ``groups`` (SQLite's group_concat).
GROUP_SEPARATOR = "\x1f"


class ScopeKind(StrEnum):
    DATASET = "dataset"
    GROUP = "group"
    USER = "user"
    NOTEBOOK = "notebook"


@dataclass(frozen=True)
class Scope:
    """A budget's holder on one dataset: the whole dataset, a group, a user or one of
    a user's notebooks (``holder`` is the group's or the user's name)."""

    kind: ScopeKind
    dataset: str
    holder: str = ""
    notebook: str = WHOLE_USER

    @classmethod
    def whole(cls, dataset: str) -> Scope:
        return cls(ScopeKind.DATASET, dataset)

    @classmethod
    def group(cls, dataset: str, name: str) -> Scope:
        return cls(ScopeKind.GROUP, dataset, name)

    @classmethod
    def user(cls, dataset: str, name: str) -> Scope:
        return cls(ScopeKind.USER, dataset, name)

    @classmethod
    def of_notebook(cls, dataset: str, user: str, notebook: str) -> Scope:
        return cls(ScopeKind.NOTEBOOK, dataset, user, notebook)

    def describe(self) -> str:
        """The budget's name in a refusal or the audit log."""
        if self.kind == ScopeKind.DATASET:
            return f"the dataset budget of {self.dataset!r} (all users together)"
        if self.kind == ScopeKind.GROUP:
            return f"the budget of group {self.holder!r} on dataset {self.dataset!r}"
        if self.kind == ScopeKind.USER:
            return f"the budget of user {self.holder} on dataset {self.dataset!r}"
        return f"the budget of notebook {self.notebook!r} of user {self.holder}"

    def named(self) -> BudgetName:
        """The scope as the HTTP API and the console name it (typed, never parsed)."""
        held = self.kind in (ScopeKind.GROUP, ScopeKind.USER, ScopeKind.NOTEBOOK)
        return BudgetName(
            budget=self.kind.value,
            dataset=self.dataset,
            holder=self.holder if held else None,
            notebook=self.notebook if self.kind == ScopeKind.NOTEBOOK else None,
        )

    def row_columns(self) -> tuple[str, str, str]:
        """The ``scope``, ``user`` and ``notebook`` columns of an admin row for this
        scope. A user's and a notebook's are written as the ledger always wrote them
        (``scope`` empty), so a ledger of an earlier release reads the same."""
        if self.kind == ScopeKind.DATASET:
            return (ScopeKind.DATASET.value, "", WHOLE_USER)
        if self.kind == ScopeKind.GROUP:
            return (ScopeKind.GROUP.value, self.holder, WHOLE_USER)
        return ("", self.holder, self.notebook)


def admin_target(row: sqlite3.Row, dataset: str) -> Scope:
    """The scope an admin row (grant, reset, renewal) was written for."""
    if row["scope"] == ScopeKind.DATASET:
        return Scope.whole(dataset)
    if row["scope"] == ScopeKind.GROUP:
        return Scope.group(dataset, row["user"])
    if row["notebook"] == WHOLE_USER:
        return Scope.user(dataset, row["user"])
    return Scope.of_notebook(dataset, row["user"], row["notebook"])


def charged_to(row: sqlite3.Row, dataset: str) -> list[Scope]:
    """The scopes a query's row spends from: the dataset, each group its user was in
    when it was charged, the user and the notebook.

    A replay row spends from its own groups (only those its serving charged: the
    asker's groups the release had not counted against yet), its user and its
    notebook, never from the dataset: the release it served is one release, already
    counted there when it was charged. A replay of the user's own answer has no
    groups and costs zero, so it changes nothing."""
    groups = row["groups"].split(GROUP_SEPARATOR) if row["groups"] else []
    whole = [] if row["status"] == REPLAYED else [Scope.whole(dataset)]
    return [
        *whole,
        *(Scope.group(dataset, g) for g in groups),
        Scope.user(dataset, row["user"]),
        Scope.of_notebook(dataset, row["user"], row["notebook"]),
    ]


def period_label(period: Period, when: datetime) -> str:
    """The period ``when`` (UTC) falls in, as the ledger records it: ``day 2026-11-26``,
    ``week 2026-W48`` (ISO weeks begin on Monday), ``month 2026-11``."""
    if period == Period.DAY:
        return f"day {when.date().isoformat()}"
    if period == Period.WEEK:
        year, week, _ = when.isocalendar()
        return f"week {year}-W{week:02d}"
    return f"month {when.year}-{when.month:02d}"


@dataclass
class Tally:
    """What counts in one scope among the ledger's rows read so far: its spending and
    grants since its last reset or renewal, and its last renewal's period."""

    spending: Composition = field(default_factory=Composition)
    granted: Composition = field(default_factory=Composition)  # (ε, δ) grants, added up
    period: str | None = None  # the label of the last ``renews`` or ``renewed`` row

    def spend(self, row: sqlite3.Row) -> None:
        """A charge counted here: composed with the spending before it (``dp/accounting``'s
        ``Composition``: each amount adds up, exactly, rounded once when read)."""
        self.spending.add(Cost(row["epsilon"], row["delta"], row["rho"]))

    def admin(self, row: sqlite3.Row) -> None:
        """A grant, reset or renewal written for this scope."""
        status = row["status"]
        if status == GRANTED:
            self.granted.add(Cost(row["epsilon"], row["delta"]))
        elif status == RESET:
            self.reset()
        elif status == RENEWED:
            # A renewal forgets the period's spending, never the owner's grants.
            self.spending = Composition()
            self.period = row["sql"]
        elif status == RENEWS:
            self.period = row["sql"]

    def spent(self) -> Cost:
        return self.spending.total()

    def limit(self, base: Budget) -> Budget:
        """``base`` (the policy's limit) plus what was granted."""
        granted = self.granted.total()
        return Budget(base.epsilon + granted.epsilon, base.delta + granted.delta, base.renew)

    def reset(self) -> None:
        self.spending, self.granted = Composition(), Composition()


def renewal_due(tally: Tally, base: Budget, now: datetime) -> tuple[str, str] | None:
    """The renewal row a charge at ``now`` must write first, as (status, period), if
    any: ``renews`` the first time a renewing limit is charged under (or after its
    period changed kind: a month's budget made weekly starts its weeks without giving
    back this month's spending), ``renewed`` in a later period of the same kind."""
    if base.renew is None:
        return None
    label = period_label(base.renew, now)
    if tally.period == label:
        return None
    last = tally.period
    if last is None or last.split(" ", 1)[0] != base.renew.value:
        return (RENEWS, label)
    return (RENEWED, label)


def applicable(
    dataset: Dataset, user: str, notebook: str, groups: frozenset[str]
) -> list[tuple[Scope, Budget]]:
    """Every budget a query of ``user`` in ``notebook`` is charged against, with its
    policy limit: the dataset's (if set), each of the user's groups' that has one,
    the user's and the notebook's; the order refusals are checked in."""
    limits: list[tuple[Scope, Budget]] = []
    if dataset.dataset_budget is not None:
        limits.append((Scope.whole(dataset.name), dataset.dataset_budget))
    for group in sorted(groups & dataset.group_budgets.keys()):
        limits.append((Scope.group(dataset.name, group), dataset.group_budgets[group]))
    limits.append((Scope.user(dataset.name, user), dataset.user_budget))
    limits.append((Scope.of_notebook(dataset.name, user, notebook), dataset.notebook_budget))
    return limits


def next_period(period: Period, now: datetime) -> str:
    """When the period after the one ``now`` falls in begins (UTC, ISO 8601)."""
    day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    if period == Period.DAY:
        start = day + timedelta(days=1)
    elif period == Period.WEEK:
        start = day + timedelta(days=7 - now.weekday())
    else:
        year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
        start = datetime(year, month, 1, tzinfo=UTC)
    return start.isoformat()
