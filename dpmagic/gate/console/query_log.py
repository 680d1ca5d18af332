"""The query log page: the ledger's rows (``owner.log``, as ``dpmagic audit``) with
filters by dataset, user, notebook, status and a text in the SQL or the reason.

Each row is who asked, when, on which dataset and notebook, the SQL, its ε and δ and
what became of it; the answer itself is never shown (the console never reads one).
A query refused before its debit (by the analysis, or over a budget) costs nothing;
the ledger keeps it with the reason its user was told, and it is listed as refused.
"""

from __future__ import annotations

from dpmagic.gate import owner
from dpmagic.gate.console.layout import Frame, esc, number, page, table, url, when
from dpmagic.gate.policy import Policy

# The most rows one page shows, and how many unless the owner asks.
MAX_ROWS = 1000
DEFAULT_ROWS = 100

HEADS = (
    "id", "time (UTC)", "user", "dataset", "notebook", "status", "ε", "δ",
    "SQL, or the budget changed and why",
)  # fmt: skip
WHAT_IS_HERE = (
    "Every query the gate charged (charged: running; released: answered; failed: out "
    "of time or memory after the debit, and still spent), every replay (served again "
    "at no cost; shared: another user's release), every query refused before the debit "
    "(by the analysis, or over a budget: nothing charged, and why, as its user was told), "
    "and every grant, reset and renewal."
)


def log_page(
    frame: Frame,
    policy: Policy,
    entries: list[owner.LogEntry],
    dataset: str,
    which: owner.LogFilter,
) -> str:
    rows = [_row(frame, e) for e in entries]
    shown = (
        table(
            HEADS,
            rows,
            numeric={0, 6, 7},
        )
        if rows
        else "<p>No entry matches.</p>"
    )
    return page(
        frame,
        "log",
        "Query log",
        f'<p class="note">{esc(WHAT_IS_HERE)}</p>'
        + _filters(frame, policy, dataset, which)
        + f"<p>{len(rows)} {'entry' if len(rows) == 1 else 'entries'}, newest first.</p>"
        + shown,
    )


def _filters(frame: Frame, policy: Policy, dataset: str, which: owner.LogFilter) -> str:
    datasets = _options([("", "all"), *((n, n) for n in sorted(policy.datasets))], dataset)
    shown = ((s, SHOWN.get(s, s)) for s in owner.STATUSES)
    statuses = _options([("", "any"), *shown], which.status or "")
    return (
        f'<form class="filters" method="get" action="{esc(frame.base)}log">'
        f'<label>dataset<select name="dataset">{datasets}</select></label>'
        f'<label>user<input name="user" value="{esc(which.user or "")}"></label>'
        f'<label>notebook<input name="notebook" value="{esc(which.notebook or "")}"></label>'
        f'<label>status<select name="status">{statuses}</select></label>'
        f'<label>SQL or reason contains<input name="q" value="{esc(which.text or "")}">'
        "</label>"
        f'<label>at most<input name="limit" type="number" min="1" max="{MAX_ROWS}" '
        f'value="{which.limit}"></label>'
        "<button>Filter</button></form>"
    )


def _options(choices: list[tuple[str, str]], chosen: str) -> str:
    return "".join(
        f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(label)}</option>'
        for v, label in choices
    )


# How the renewal rows read: the first charge under a renewing budget opens its first
# period ("renews" in the ledger), a later period's first charge renews it.
SHOWN = {owner.RENEWS: "period begins", owner.RENEWED: "renewed"}


def _row(frame: Frame, e: owner.LogEntry) -> list[str]:
    status = SHOWN.get(e.status, e.status)
    if e.replayed and e.source is not None:
        status = f"replayed (shared: #{e.source})"
    what = f'<span class="status {esc(e.status)}">{esc(status)}</span>'
    if e.target is not None:
        changed = esc(e.target.describe())
        text = f"<b>{changed}</b>: {esc(e.sql)}"
    elif e.reason is not None:
        text = f'{esc(e.sql)}<div class="reason">refused: {esc(e.reason)}</div>'
    else:
        text = esc(e.sql)
    user_link = url(frame.base, "log", dataset=e.dataset, user=e.user)
    return [
        str(e.id),
        esc(when(e.time)),
        f'<a href="{esc(user_link)}">{esc(e.user)}</a>' if e.user else "",
        esc(e.dataset),
        esc(e.notebook),
        what,
        number(e.epsilon),
        number(e.delta),
        f'<div class="sql">{text}</div>',
    ]
