"""The frame every console page shares, and the helpers that put values into HTML.

Every value from the ledger or the policy (a user's name, a notebook's, a query's
SQL, a reason) is written through ``esc``: the log holds text users chose, and a page
that ran it as markup would act with the owner's session. The pages carry no script
at all, and ``server.py`` forbids any by the Content-Security-Policy, so an escape
that was missed still could not run. The style is inline: the console is one
process, and nothing is fetched from anywhere else.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from dpmagic.gate.console.guards import CSRF_FIELD
from dpmagic.gate.console.owners import Owner

# The pages, in the order of the navigation bar: (path below the console's base, title).
PAGES = (
    ("", "Overview"),
    ("budgets", "Budgets"),
    ("log", "Query log"),
    ("renewals", "Renewals"),
    ("change", "Change a budget"),
)

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d232a; background: #f6f7f9; }
header { background: #22303c; color: #fff; padding: 8px 20px; display: flex; gap: 18px;
  align-items: center; flex-wrap: wrap; }
header b { font-size: 16px; }
header nav a { color: #cfe3f5; margin-right: 14px; text-decoration: none; }
header nav a.on { color: #fff; border-bottom: 2px solid #7fc1ff; }
header .who { margin-left: auto; color: #cfe3f5; }
header form { display: inline; }
main { padding: 12px 20px 40px; max-width: 1200px; }
h1 { font-size: 20px; margin: 10px 0; } h2 { font-size: 17px; margin: 22px 0 8px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0 14px; }
th, td { border: 1px solid #d8dde3; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
div.sql { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap;
  max-width: 520px; overflow-wrap: anywhere; }
.note { color: #4b5560; max-width: 900px; }
.flash { background: #e3f4e1; border: 1px solid #9fd39a; padding: 6px 10px; margin: 8px 0; }
.error { background: #fbe4e4; border: 1px solid #e2a0a0; padding: 6px 10px; margin: 8px 0; }
.status { padding: 1px 6px; border-radius: 3px; background: #e7ebef; white-space: nowrap; }
.status.released { background: #dff0dc; } .status.failed { background: #f7dcdc; }
.status.replayed { background: #e0ebf8; } .status.granted, .status.reset { background: #f6ecd2; }
.status.renews, .status.renewed { background: #ebe2f5; }
.status.refused { background: #eeeeee; } .reason { color: #8a1f11; font-size: 0.9em; }
form.filters { display: flex; gap: 10px; flex-wrap: wrap; align-items: end; margin: 8px 0; }
form.filters label, form.change label { display: flex; flex-direction: column; font-size: 12px; }
form.change { display: inline-grid; grid-template-columns: repeat(3, minmax(180px, 260px));
  gap: 10px;
  background: #fff; padding: 12px; border: 1px solid #d8dde3; }
form.change .wide { grid-column: 1 / -1; }
form.change fieldset { border: 1px solid #d8dde3; display: flex; gap: 10px; flex-wrap: wrap;
  margin: 0; padding: 6px 10px 10px; }
form.change fieldset label { min-width: 180px; }
form.change legend { font-weight: 600; padding: 0 4px; }
nav.kinds { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 8px;
  max-width: 900px; margin: 10px 0; }
nav.kinds > span { grid-column: 1 / -1; font-weight: 600; }
nav.kinds a { display: flex; flex-direction: column; padding: 6px 12px; border: 1px solid #c4ccd4;
  border-radius: 4px; background: #fff; color: #1d232a; text-decoration: none; }
nav.kinds a small { color: #4b5560; }
nav.kinds a.on { border: 2px solid #2d6fb7; background: #e6f0fb; }
button.primary { background: #2d6fb7; color: #fff; border: 1px solid #245c99; border-radius: 3px; }
button.danger { background: #fff; color: #a1261b; border: 1px solid #a1261b; border-radius: 3px; }
section.confirm button.danger { background: #a1261b; color: #fff; }
button.warn { background: #fff; color: #6b4a00; border: 1px solid #b8860b; border-radius: 3px; }
.danger-zone { border-top: 1px dashed #d8b4b0; padding-top: 10px; margin-top: 6px; display: flex;
  gap: 12px; align-items: center; justify-content: space-between; color: #4b5560; }
section.confirm { background: #fff8e6; border: 1px solid #e0c36d; padding: 4px 14px 10px;
  margin: 10px 0; max-width: 900px; }
section.confirm h2 { margin-top: 8px; }
section.confirm a.cancel { margin-left: 12px; }
input, select, textarea, button { font: inherit; padding: 3px 6px; }
button { cursor: pointer; }
svg text { font: 11px system-ui, sans-serif; fill: #4b5560; }
.chart { background: #fff; border: 1px solid #d8dde3; margin: 6px 0 14px; display: inline-block; }
"""


def esc(value: object) -> str:
    """``value`` as text in HTML, quotes included (safe inside an attribute too)."""
    return html.escape(str(value), quote=True)


def number(value: float | None) -> str:
    """A budget amount for reading: six significant digits, ∞ for no limit."""
    if value is None:
        return ""
    if math.isinf(value):
        return "∞"
    return f"{value:.6g}"


def when(time: datetime) -> str:
    """A ledger time (UTC) to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


def url(base: str, path: str, **query: str) -> str:
    """A console URL: ``path`` below ``base`` with the non-empty query parameters."""
    given = {k: v for k, v in query.items() if v}
    return base + path + ("?" + urlencode(given) if given else "")


@dataclass(frozen=True)
class Frame:
    """What every page of one response shares: the console's base URL, who is signed
    in, their session's CSRF token (None for a bearer token's request, which has no
    session) and a message left by the last change."""

    base: str
    owner: Owner
    csrf: str | None = None
    flash: str | None = None

    def csrf_field(self) -> str:
        if self.csrf is None:
            return ""
        return f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(self.csrf)}">'


def page(frame: Frame, path: str, title: str, body: str) -> str:
    """A whole page: the navigation (``path``'s entry marked), the owner and the body."""
    nav = "".join(
        f'<a href="{esc(frame.base + p)}"{" class=on" if p == path else ""}>{esc(t)}</a>'
        for p, t in PAGES
    )
    out = (
        f'<form method="post" action="{esc(frame.base)}logout">{frame.csrf_field()}'
        "<button>Sign out</button></form>"
        if frame.csrf is not None
        else ""
    )
    flash = f'<p class="flash">{esc(frame.flash)}</p>' if frame.flash else ""
    return bare(
        title,
        f"<header><b>dpmagic console</b><nav>{nav}</nav>"
        f'<span class="who">signed in as {esc(frame.owner.by)}</span>{out}</header>'
        f"<main><h1>{esc(title)}</h1>{flash}{body}</main>",
    )


def bare(title: str, body: str) -> str:
    """A page without the console's navigation (sign-in, refusals)."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · dpmagic console</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def table(
    heads: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: frozenset[int] | set[int] = frozenset(),
) -> str:
    """A table of HTML cells (each already escaped); columns in ``numeric`` right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in heads)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
