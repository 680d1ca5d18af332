"""A ``%%dpsql`` answer as terminal text *with* its intervals, for ``dpmagic demo``.

A result's ``text/plain`` form shows the noisy values alone; read in a
terminal, a noisy ``-53`` then looks like a fact. Its HTML form carries each
noisy cell's interval (the hover text and the "95% intervals" toggle), so the
demo reads the intervals from there, with the standard library's HTML parser,
and prints them beside the values.
"""

from __future__ import annotations

from html.parser import HTMLParser

import pandas as pd

RESULT_CLASS = "dpmagic-result"


class _ResultParser(HTMLParser):
    """Collects the table's headers and cells, each cell's interval, the footer."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.rows: list[list[list[str]]] = []  # row → cell → [value, interval]
        self.footer = ""
        self.level = ""
        self._field: tuple[str, int] | None = None  # what text goes where

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "tr":
            self.rows.append([])
        elif tag == "th":
            self.headers.append("")
            self._field = ("th", 0)
        elif tag == "td" and self.rows:
            self.rows[-1].append(["", ""])
            self._field = ("td", 0)
        elif tag == "span" and "dpm-int" in classes and self._field:
            self._field = ("td", 1)
        elif tag == "span" and "dpm-footer-text" in classes:
            self._field = ("footer", 0)
        elif tag == "summary":
            self._field = ("summary", 0)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td", "summary") or (tag == "span" and self._field == ("footer", 0)):
            self._field = None
        elif tag == "span" and self._field == ("td", 1):
            self._field = ("td", 0)

    def handle_data(self, data: str) -> None:
        if self._field is None:
            return
        kind, part = self._field
        if kind == "th":
            self.headers[-1] += data
        elif kind == "td":
            self.rows[-1][-1][part] += data
        elif kind == "footer":
            self.footer += data
        else:
            self.level += data


def result_text(html: str) -> str | None:
    """The answer's table with ``value [low, high]`` in each noisy cell, and its
    footer; None if ``html`` is not a dpmagic result or has no interval."""
    if RESULT_CLASS not in html:
        return None
    parser = _ResultParser()
    parser.feed(html)
    rows = [row for row in parser.rows if row]
    if not any(interval for row in rows for _, interval in row):
        return None
    cells = [[f"{v.strip()} {i.strip()}".strip() for v, i in row] for row in rows]
    table = pd.DataFrame(cells, columns=parser.headers).to_string(index=False)
    level = parser.level.strip() or "intervals"
    return f"{table}\n({level} beside each noisy value)\n{parser.footer.strip()}"
