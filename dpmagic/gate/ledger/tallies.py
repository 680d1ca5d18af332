"""How each ledger row counts for a budget scope, and the tallies a ledger keeps per
dataset, brought up to date with the rows appended since they were last read
(``Ledger._tally``)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from dpmagic.gate.ledger.scopes import (
    ADMIN,
    RESET,
    SPENDING,
    Scope,
    ScopeKind,
    Tally,
    admin_target,
    charged_to,
)


def count(row: sqlite3.Row, scope: Scope, tally: Tally) -> None:
    """Count one row for ``scope``, if it counts there: a charge for each scope it was
    charged to; an admin row for its own scope, and a user's reset for each of the
    user's notebooks too (a notebook's own reset never gives back the user's budget)."""
    if row["status"] in SPENDING:
        if scope in charged_to(row, scope.dataset):
            tally.spend(row)
    elif row["status"] in ADMIN:
        target = admin_target(row, scope.dataset)
        cascade = (
            row["status"] == RESET
            and target.kind == ScopeKind.USER
            and scope.kind == ScopeKind.NOTEBOOK
            and scope.holder == target.holder
        )
        if target == scope or cascade:
            tally.admin(row)


@dataclass
class Cursor:
    """The tallies of one dataset's scopes, all brought up to row id ``seen``."""

    seen: int = 0
    tallies: dict[Scope, Tally] = field(default_factory=dict)
