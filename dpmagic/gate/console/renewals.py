"""The renewals page: each renewing budget of the policy (``owner.renewals``), its
period, the period now, when the next begins, and its renewal rows in the ledger.

A renewal is configured in the policy and written by the gate, at the first charge
in a new period; it is never done by hand. To start a budget afresh early, an owner
resets it ("Change a budget"): a reset is logged with who did it and why, and
forgets the budget's grants as well as its spending. A manual "renewal" row would be
one the log could not tell from the gate's own (its period is what the gate writes),
so the log would no longer explain every budget by itself.

Here the page's text is gathered; ``templates/renewals.html`` draws it.
"""

from __future__ import annotations

from dpmagic.gate import owner
from dpmagic.gate.console.layout import Frame, Table, number, page, when
from dpmagic.gate.console.query_log import SHOWN
from dpmagic.gate.ledger.scopes import ScopeKind

HEADS = ("dataset", "budget", "ε", "δ", "every", "period now", "next begins (UTC)", "rows")
NOTE = (
    "A renewing budget bounds what is spent within one period (a UTC day, ISO week or "
    "calendar month). Its renewal is written by the gate at the first charge in a new "
    "period, never backdated: spending before it stays counted in its own period. To "
    "start a budget afresh early, reset it (Change a budget), with a reason: the reset "
    "also forgets its grants."
)


def renewals_page(frame: Frame, found: list[owner.Renewal]) -> str:
    summary = [
        [
            r.dataset,
            _budget(r),
            number(r.limit.epsilon),
            number(r.limit.delta),
            r.period.value,
            r.current,
            when(r.next_begins),
            str(len(r.history)),
        ]
        for r in found
    ]
    histories = [
        (
            f"{r.dataset}: {_budget(r)}",
            Table(
                ["id", "time (UTC)", "row", "whose", "period"],
                [
                    [str(e.id), when(e.time), SHOWN.get(e.status, e.status), _holder(e), e.sql]
                    for e in r.history
                ],
                frozenset({0}),
            ),
        )
        for r in found
        if r.history
    ]
    return page(
        frame,
        "renewals",
        "renewals.html",
        note=NOTE,
        summary=Table(HEADS, summary, frozenset({2, 3, 7})) if found else None,
        histories=histories,
    )


def _budget(r: owner.Renewal) -> str:
    if r.kind == ScopeKind.DATASET:
        return "the dataset (all users together)"
    if r.kind == ScopeKind.GROUP:
        return f"group {r.group}"
    return "each user" if r.kind == ScopeKind.USER else "each notebook"


def _holder(e: owner.LogEntry) -> str:
    if e.target is None or e.target.kind == ScopeKind.DATASET:
        return "all users"
    if e.target.kind == ScopeKind.NOTEBOOK:
        return f"{e.target.holder}, {e.target.notebook}"
    return e.target.holder
