"""The templates every console page is drawn from, and the helpers that give them values.

Every page is a tornado template in ``templates/``, loaded by one ``Loader`` with
escaping on (``xhtml_escape``, tornado's default): each ``{{ value }}`` is written as
text, quotes included, so a user's name, a notebook's, a query's SQL or a reason
from the ledger cannot become markup, in an element or in an attribute. Python
builds no HTML: the page modules hand the templates text, and no template writes a
value raw (``tests/unit/test_console_templates.py`` holds both). A page that ran a
user's text as markup would act with the owner's session; the pages also carry no
script at all, and ``server.py`` forbids any by the Content-Security-Policy, so a
value written raw by mistake still could not run. The style is inline (in
``base.html``): the console is one process, and nothing is fetched from anywhere else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode

from tornado.template import Loader

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
TITLES = dict(PAGES)
TEMPLATES = Path(__file__).with_name("templates")
# Escaping on for every template (tornado's default, said here so that it is seen).
# "oneline": the templates' own line breaks and indents become one space, so a page
# is laid out as the browser reads it, not as its template is indented.
LOADER = Loader(
    str(TEMPLATES),
    autoescape="xhtml_escape",
    whitespace="oneline",
    namespace={"PAGES": PAGES, "CSRF_FIELD": CSRF_FIELD},
)


def render(template: str, **values: object) -> str:
    """``template`` drawn with ``values``, every one of them escaped where it is written."""
    return LOADER.load(template).generate(**values).decode()


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


@dataclass(frozen=True)
class Table:
    """A table of text cells (``_table.html``); the columns in ``numeric`` right-aligned."""

    heads: Sequence[str]
    rows: Sequence[Sequence[str]]
    numeric: frozenset[int] = frozenset()


def page(frame: Frame, path: str, template: str, **values: object) -> str:
    """A whole page of the navigation's (``path``'s entry marked): ``template``, which
    extends ``page.html``, drawn with ``values``."""
    return render(template, frame=frame, path=path, title=TITLES[path], **values)


def message(title: str, text: str) -> str:
    """A page without the console's navigation that says one thing (a refusal, an
    error, a request not understood)."""
    return render("message.html", title=title, text=text)
