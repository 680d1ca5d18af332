"""The renewals page: each renewing budget of the policy (``owner.renewals``), its
period, the period now, when the next begins, and its renewal rows in the ledger.

A renewal is configured in the policy and written by the gate, at the first charge
in a new period; it is never done by hand. To start a budget afresh early, an owner
resets it ("Change a budget"): a reset is logged with who did it and why, and
forgets the budget's grants as well as its spending. A manual "renewal" row would be
one the log could not tell from the gate's own (its period is what the gate writes),
so the log would no longer explain every budget by itself.
"""

from __future__ import annotations

from dpmagic.gate import owner
from dpmagic.gate.console.layout import Frame, esc, number, page, table, when
from dpmagic.gate.console.query_log import SHOWN
from dpmagic.gate.service.budget_scopes import ScopeKind

HEADS = ("dataset", "budget", "ε", "δ", "every", "period now", "next begins (UTC)", "rows")
NOTE = (
    "A renewing budget bounds what is spent within one period (a UTC day, ISO week or "
    "calendar month). Its renewal is written by the gate at the first charge in a new "
    "period, never backdated: spending before it stays counted in its own period. To "
    "start a budget afresh early, reset it (Change a budget), with a reason: the reset "
    "also forgets its grants."
)


def renewals_page(frame: Frame, found: list[owner.Renewal]) -> str:
    if not found:
        return page(
            frame,
            "renewals",
            "Renewals",
            f'<p class="note">{esc(NOTE)}</p><p>No budget of the policy renews.</p>',
        )
    parts = [f'<p class="note">{esc(NOTE)}</p>']
    summary = [
        [
            esc(r.dataset),
            esc(_budget(r)),
            number(r.limit.epsilon),
            number(r.limit.delta),
            esc(r.period.value),
            esc(r.current),
            esc(when(r.next_begins)),
            str(len(r.history)),
        ]
        for r in found
    ]
    parts.append(table(HEADS, summary, numeric={2, 3, 7}))
    for r in found:
        if not r.history:
            continue
        rows = [
            [
                str(e.id),
                esc(when(e.time)),
                esc(SHOWN.get(e.status, e.status)),
                esc(_holder(e)),
                esc(e.sql),
            ]
            for e in r.history
        ]
        parts.append(
            f"<h2>{esc(r.dataset)}: {esc(_budget(r))}</h2>"
            + table(["id", "time (UTC)", "row", "whose", "period"], rows, numeric={0})
        )
    return page(frame, "renewals", "Renewals", "".join(parts))


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
