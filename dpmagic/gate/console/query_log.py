"""The query log page: the ledger's rows (``owner.log``, as ``dpmagic audit``) with
filters by dataset, user, notebook, status and a text in the SQL or the reason.

Each row is who asked, when, on which dataset and notebook, the SQL, its ε and δ and
what became of it; the answer itself is never shown (the console never reads one).
A query refused before its debit (by the analysis, or over a budget) costs nothing;
the ledger keeps it with the reason its user was told, and it is listed as refused.

Here the page's text is gathered; ``templates/log.html`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmagic.gate import owner
from dpmagic.gate.console.layout import Frame, number, page, url, when
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


@dataclass(frozen=True)
class LogRow:
    """A ledger row as the log shows it: ``status`` its class, ``shown`` as it reads;
    ``changed`` the budget a grant, reset or renewal changed; ``reason`` why a query
    was refused; ``user_link`` the log filtered to its user."""

    id: int
    time: str
    user: str
    user_link: str
    dataset: str
    notebook: str
    status: str
    shown: str
    epsilon: str
    delta: str
    sql: str
    changed: str | None
    reason: str | None


def log_page(
    frame: Frame,
    policy: Policy,
    entries: list[owner.LogEntry],
    dataset: str,
    which: owner.LogFilter,
) -> str:
    datasets = [("", "all"), *((n, n) for n in sorted(policy.datasets))]
    statuses = [("", "any"), *((s, SHOWN.get(s, s)) for s in owner.STATUSES)]
    return page(
        frame,
        "log",
        "log.html",
        note=WHAT_IS_HERE,
        heads=HEADS,
        rows=[_row(frame, e) for e in entries],
        datasets=datasets,
        dataset=dataset,
        statuses=statuses,
        which=which,
        max_rows=MAX_ROWS,
    )


# How the renewal rows read: the first charge under a renewing budget opens its first
# period ("renews" in the ledger), a later period's first charge renews it.
SHOWN = {owner.RENEWS: "period begins", owner.RENEWED: "renewed"}


def _row(frame: Frame, e: owner.LogEntry) -> LogRow:
    shown = SHOWN.get(e.status, e.status)
    if e.replayed and e.source is not None:
        shown = f"replayed (shared: #{e.source})"
    return LogRow(
        id=e.id,
        time=when(e.time),
        user=e.user,
        user_link=url(frame.base, "log", dataset=e.dataset, user=e.user),
        dataset=e.dataset,
        notebook=e.notebook,
        status=e.status,
        shown=shown,
        epsilon=number(e.epsilon),
        delta=number(e.delta),
        sql=e.sql,
        changed=e.target.describe() if e.target is not None else None,
        reason=e.reason if e.target is None else None,
    )
