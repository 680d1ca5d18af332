"""What the notebook shows for a gate reply: answers, their accuracy, their cost.

A noisy number is only useful next to how noisy it is and what it cost, so
the rendering shows each cell's 95% interval beside its value (the gate's, with
its verdict on whether noise dominates the cell: ``cells.py``) and closes with
a footer of the ε spent and left. Every string here came over the wire, so
everything is HTML-escaped; colours are inherited from the front end's theme
(JupyterLab's CSS variables, with plain fallbacks) so dark mode just works.
"""

from __future__ import annotations

import builtins  # DPResult.dict() (JupySQL's name) hides the builtin in the class
from collections.abc import Iterator
from functools import cached_property
from html import escape
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from msgspec import to_builtins
from msgspec.structs import replace

from dpmagic import wire
from dpmagic.display.cells import ALPHA, CellAccuracy, cell_accuracy
from dpmagic.display.plan import HEADERS, OUTPUT_HEADERS, dominance_warnings, output_rows, plan_rows
from dpmagic.display.render import (
    BUDGET_METADATA,
    MOCK_LABEL,
    MUTED,
    STYLE,
    amount,
    budget_bar,
    budget_left,
    budget_number,
    format_exact,
    format_value,
    markdown_escape,
    markdown_table,
    table,
)
from dpmagic.protocol import (
    Accuracy,
    Bounding,
    BudgetName,
    Clip,
    ColumnAccuracy,
    Cost,
    LeftOut,
    QueryReply,
    Shared,
    Stage,
    reply_of,
)


def shared_note(shared: Shared, cost: Cost) -> str:
    """A shared answer's footer: when and at what cost another user's release of the
    same question was made, and what serving it charged this user (nothing where the
    release already counted against every budget they are under)."""
    when = shared.released_at[:16].replace("T", " ")
    released = amount(shared.cost)
    charged = shared.charged_to
    if not charged or not (cost.epsilon or cost.delta):
        mine = "no cost to you: its release already counted against your budgets"
    else:
        names = ", ".join(_scope_name(s) for s in charged)
        mine = f"{amount(cost)} charged to {names}, which it had not counted against"
    return f"shared answer, released to another user {when} UTC at {released} ({mine})"


def _scope_name(scope: BudgetName) -> str:
    """A budget as the footer names it, from the gate's typed scope."""
    kind = scope.budget
    if kind == "group":
        return f"group {scope.holder}'s budget"
    if kind == "notebook":
        return f"notebook {scope.notebook}'s budget"
    if kind == "user":
        return "your budget"
    return f"the {kind} budget"


def clip_notes(clip: Clip) -> list[str]:
    """What ``--clip`` did, per summed aggregate, as the gate's typed facts say: the
    bounds chosen from the data (the cells are of the values moved into them, with
    the noisy count of values moved), or the declared bounds kept, and why; and the
    rows each person brings, chosen or kept."""
    spent = budget_number(clip.epsilon, up=True)
    notes = []
    for c in clip.chosen:
        lo, hi = (format_value(b) for b in c.bounds)
        if c.source == "declared":
            notes.append(f"--clip kept {c.aggregate}'s declared bounds [{lo}, {hi}]: "
                         f"{c.reason or ''}")  # fmt: skip
            continue
        note = f"values clipped: {c.aggregate} within [{lo}, {hi}] (chosen with ε {spent})"
        if c.source == "data":
            moved = sum(max(int(m.count), 0) for m in c.moved or [])
            note += (f"; cells and intervals are of the values moved into these bounds; "
                     f"about {moved:,} values moved")  # fmt: skip
        notes.append(note)
    rows = clip.rows
    if rows is not None and rows.source == "data":
        notes.append(
            f"rows per person: at most {rows.rows:,} in each group (chosen with ε {spent}: "
            f"{rows.reason}); a person's rows beyond it are left out"
        )
    elif rows is not None:
        notes.append(f"--clip kept the rows per person at {rows.rows:,}: {rows.reason}")
    return notes


def stage_notes(stages: list[Stage], dry_run: bool) -> list[str]:
    """What a query's subqueries released before it, as the gate's typed facts say:
    each subquery, the value that went into the query, its 95% interval and its ε (a
    dry run: what each will cost)."""
    notes = []
    for stage in stages:
        spent = budget_number(stage.epsilon, up=True)
        if dry_run or not stage.released:
            notes.append(f"released first, with ε {spent}: {stage.sql}")
            continue
        again = ", replayed" if stage.replayed else ""
        if stage.rows is not None:
            notes.append(
                f"released first, with ε {spent}{again}: {stage.sql} ({stage.rows:,} rows "
                "with noise); the query worked on these rows"
            )
            continue
        value = format_value(stage.value) if isinstance(stage.value, float | int) else "NULL"
        interval = stage.interval
        within = (
            f" (95% interval {format_value(interval[0])} to {format_value(interval[1])})"
            if isinstance(interval, list)
            else ""
        )
        notes.append(
            f"released first, with ε {spent}{again}: {stage.sql} = {value}{within}; "
            "the query compared with this noisy value"
        )
    return notes


MOCK_MEANING = (
    "answered on fake rows drawn from the public schema (declared bounds and values) in "
    "this kernel; the query never reached the gate and nothing was charged"
)


class DPResult:
    """One reply to ``POST /v1/query``: noisy rows plus their cost and accuracy.

    JupySQL's result names work too: ``DataFrame()``, ``PolarsDataFrame()``,
    ``csv()``, ``dict()``, ``len()`` and iteration over the rows as tuples.

    ``reply`` is the reply (a `protocol.QueryReply`, or its JSON object, read into one),
    or with ``cells`` (an Arrow table, ``dpmagic/wire.py``) the reply's envelope: the
    rows and each cell's interval and verdict are then read from the columns when first
    asked for, not made as a Python object per cell as the reply arrives (``df`` is
    made from the columns directly).
    """

    def __init__(
        self,
        reply: QueryReply | dict[str, Any],
        display_limit: int | None = None,
        intervals: str = "shown",
        cells: pa.Table | None = None,
    ) -> None:
        envelope = reply if isinstance(reply, QueryReply) else reply_of(reply)
        self.envelope = envelope
        """The reply as the wire's struct (with ``cells``, without its rows)."""
        self._cells = cells
        self._fields = {} if cells is None else wire.fields(cells)
        self.dataset: str = envelope.dataset
        self.columns: list[str] = list(envelope.columns)
        self.cost: dict[str, float] = to_builtins(envelope.cost)
        # As JSON for users (``result.budget["notebook"]["remaining"]``); shown from the
        # typed ``envelope.budget``.
        self.budget: dict[str, Any] = to_builtins(envelope.budget)
        self.replayed: bool = envelope.replayed
        # Another user's release of the same question (``share_releases``), served with
        # what it charged this user's budgets it had not counted against.
        self.shared: dict[str, Any] | None = (
            None if envelope.shared is None else to_builtins(envelope.shared)
        )
        self.dry_run: bool = envelope.dry_run
        self.mock: bool = envelope.mock is not None
        """Answered on fake tables made from the public schema (``--mock``), not the data."""
        # As JSON for users (``result.plan[0]["scale"]``); shown from ``envelope.plan``.
        self.plan: list[dict[str, Any]] = to_builtins(envelope.plan)
        self.display_limit = display_limit
        """Rows shown by the HTML and text views; ``None`` or 0 shows all."""
        self.intervals = intervals
        """``"shown"`` (the default): each cell's interval beside its value;
        ``"hover"``: intervals in tooltips and behind a toggle; ``"inline"``:
        ``value ± half-width`` in every noisy cell. Cells noise dominates are
        flagged whatever this says."""
        self.notebook: str | None = None
        """The notebook that was charged, for the status bar; set by the magic."""

    @cached_property
    def reply(self) -> dict[str, Any]:
        """The reply as JSON carries it (rows and per-cell lists as lists)."""
        if self._cells is None:
            return self.envelope.json()
        return wire.merged(self.envelope.json(), self._cells)

    @cached_property
    def rows(self) -> list[list[Any]]:
        """The noisy rows, each a list of values in the columns' order."""
        if self._cells is None:
            return [list(r) for r in self.envelope.rows]
        columns = [wire.values(self._cells, self._fields, j) for j in range(len(self.columns))]
        return [list(row) for row in zip(*columns, strict=True)] if columns else []

    @cached_property
    def accuracy(self) -> dict[str, Any]:
        """``alpha`` and, per output column, how its cells are noised, each cell's interval
        and verdict (``None`` for a group key)."""
        if self._cells is None:
            return to_builtins(self._accuracy)
        return self.reply.get("accuracy") or to_builtins(self._accuracy)

    @cached_property
    def _columns(self) -> list[ColumnAccuracy | None]:
        """Each output column's accuracy (None for a group key), its per-cell lists as
        lists (read from the Arrow columns when the reply came as Arrow)."""
        given = self._accuracy.columns
        if self._cells is None:
            return list(given)
        return [
            None if c is None else replace(c, **wire.cell_parts(self._cells, self._fields, j))
            for j, c in enumerate(given)
        ]

    @property
    def _accuracy(self) -> Accuracy:
        """The envelope's accuracy (without per-cell lists when the cells are Arrow's);
        a reply without one (a dry run's transcript stand-in) has no noisy column."""
        return self.envelope.accuracy or Accuracy(alpha=ALPHA, columns=[])

    @cached_property
    def df(self) -> pd.DataFrame:
        """The noisy answer as a DataFrame, one column per output column."""
        if self._cells is None:
            return pd.DataFrame(self.rows, columns=self.columns)
        return _frame(self._cells, self._fields, self.columns)

    @cached_property
    def pl(self) -> Any:
        """The noisy answer as a polars DataFrame (needs ``pip install polars``)."""
        try:
            import polars
        except ImportError:
            raise ImportError("polars is not installed: pip install polars") from None
        return polars.DataFrame(
            self.rows, schema=self.columns, orient="row", strict=False, infer_schema_length=None
        )

    def DataFrame(self) -> pd.DataFrame:
        """``.df`` under JupySQL's name."""
        return self.df

    def PolarsDataFrame(self) -> Any:
        """``.pl`` under JupySQL's name."""
        return self.pl

    def dict(self) -> dict[str, tuple[Any, ...]]:
        """Column name → its values, as JupySQL's ``ResultSet.dict()``."""
        return {c: tuple(row[i] for row in self.rows) for i, c in enumerate(self.columns)}

    def csv(self, filename: str | None = None, **kwargs: Any) -> str | None:
        """The noisy rows as CSV: returned, or written to ``filename``."""
        return self.df.to_csv(filename, index=False, **kwargs)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return (tuple(row) for row in self.rows)

    def __len__(self) -> int:
        return self._cells.num_rows if self._cells is not None else len(self.rows)

    def plot(self, kind: str = "bar", x: str | None = None, y: str | None = None) -> Any:
        """Bars, a histogram or a line with 95% intervals as error bars (matplotlib)."""
        from dpmagic.display.plot import plot

        return plot(self, kind=kind, x=x, y=y)

    @property
    def confidence(self) -> float:
        """The coverage of the reported intervals, e.g. 0.95."""
        return 1.0 - self._accuracy.alpha

    @property
    def keys(self) -> list[str]:
        """The group-key columns: those that carry no noise."""
        given = self._accuracy.columns
        return [c for i, c in enumerate(self.columns) if i >= len(given) or given[i] is None]

    def interval(self, column: str) -> pd.DataFrame:
        """Each row's interval for ``column``: the group keys, then ``lower`` and ``upper``
        (NaN where an expression's interval is unknown), in the rows' order. A
        quantile's holds its group's true quantile (docs/accuracy.md, "Accuracy of
        quantiles"); ``percentiles`` gives its band of the group's percentiles."""
        return self._pairs(column, "intervals")

    def rank_radius(self, column: str) -> float:
        """For a quantile column, ``r`` such that with the reported confidence each
        released value's rank imbalance is within ``r`` of the best candidate's
        (docs/accuracy.md, "Accuracy of quantiles")."""
        info = self._noisy_column(column)
        if info.rank_radius is None:
            raise ValueError(f"column {column!r} is not a quantile: see interval({column!r})")
        return float(info.rank_radius)

    def percentiles(self, column: str) -> pd.DataFrame:
        """For a quantile column, each row's band of its group's percentiles (``lower`` and
        ``upper``, shares in [0, 1]) at the reported confidence; NaN where the query has
        no count of the quantile's argument to judge it by."""
        info = self._noisy_column(column)
        if info.rank_radius is None and info.rule != "percentiles":
            raise ValueError(f"column {column!r} is not a quantile: see interval({column!r})")
        return self._pairs(column, "percentiles")

    def _pairs(self, column: str, part: str) -> pd.DataFrame:
        """The group keys, then a per-cell pair's ``lower`` and ``upper`` (NaN where the
        gate sent none), read from the columns when the reply came as Arrow."""
        info = self._noisy_column(column)
        index = self.columns.index(column)
        frame = self.df[self.keys].copy()
        ends = [self._fields.get((index, f"{part}.{end}")) for end in wire.ENDS]
        if self._cells is not None and None not in ends:
            for end, field in zip(("lower", "upper"), ends, strict=True):
                values = self._cells.column(field).to_numpy(zero_copy_only=False)
                frame[end] = np.asarray(values, dtype=float)  # null → NaN
            return frame
        nan = float("nan")
        given = (info.intervals if part == "intervals" else info.percentiles) or [None] * len(self)
        frame["lower"] = [p[0] if p else nan for p in given]
        frame["upper"] = [p[1] if p else nan for p in given]
        return frame

    def noise_dominates(self, column: str) -> list[bool | None]:
        """Per row, the gate's verdict on whether noise dominates the cell: True, False,
        or None where it cannot tell (read it as noise too); False for a group key
        (docs/accuracy.md, "When noise dominates")."""
        index = self.columns.index(column)
        return [
            False if (a := self._cell(index, r)) is None else a.verdict
            for r in range(len(self.rows))
        ]

    def _noisy_column(self, column: str) -> ColumnAccuracy:
        if column not in self.columns:
            raise KeyError(f"no column {column!r}; columns are {self.columns}")
        given = self._columns
        index = self.columns.index(column)
        info = given[index] if index < len(given) else None
        if info is None:
            raise ValueError(f"column {column!r} is a group key: it carries no noise")
        return info

    def _cell(self, column: int, row: int) -> CellAccuracy | None:
        """The accuracy of ``rows[row][column]``, or None for a group key."""
        info = self._columns[column] if column < len(self._columns) else None
        if info is None:
            return None
        value = self.rows[row][column]
        return cell_accuracy(info, value, row, format_value, f"{self.confidence:.0%}")

    def _shown_rows(self) -> list[int]:
        limit = self.display_limit or len(self.rows)
        return list(range(min(limit, len(self.rows))))

    def _dominated_count(self) -> tuple[int, int]:
        """Shown cells noise dominates, and those it may dominate."""
        verdicts = [
            a.verdict
            for r in self._shown_rows()
            for c in range(len(self.columns))
            if (a := self._cell(c, r)) is not None
        ]
        return verdicts.count(True), verdicts.count(None)

    def footer(self) -> str:
        """One line: what this query cost and what is left."""
        envelope = self.envelope
        parts = []
        if self.mock:
            parts.append(f"{MOCK_LABEL}: fake rows drawn from the public schema, nothing charged")
        elif self.dry_run and envelope.offline:
            parts.append(
                f"dry run: nothing charged; it would spend {amount(self.cost)} "
                "(its plan is not in the transcript: ask the gate for it)"
            )
        elif self.dry_run:
            parts.append(f"dry run: nothing charged; it would spend {amount(self.cost)}")
            if envelope.engine == "spark":
                parts.append("answered by Spark")
        elif envelope.post_processed is not None:
            done = envelope.post_processed
            parts.append(
                f"{amount(self.cost)} spent on the releases below; the rest of the query "
                "worked on them (and public tables) at no further cost"
            )
            if done.truncated:
                parts.append(f"the first {done.row_limit or 0:,} rows (the dataset's limit)")
        elif envelope.exact is not None:
            exact = envelope.exact
            parts.append("exact: it reads only public tables, so nothing was charged")
            if exact.truncated:
                parts.append(f"the first {exact.row_limit or 0:,} rows (the dataset's limit)")
        elif envelope.shared is not None:
            parts.append(shared_note(envelope.shared, envelope.cost))
        elif self.replayed:
            parts.append("replayed (no cost)")
        else:
            parts.append(f"{amount(self.cost)} spent")
            if envelope.fresh_because:
                parts.append(f"answered afresh: {envelope.fresh_because}")
        if envelope.clip and not self.dry_run:
            parts.extend(clip_notes(envelope.clip))
        if envelope.stages:
            parts.extend(stage_notes(envelope.stages, self.dry_run))
        if envelope.per_person:
            parts.append("per person: " + "; ".join(p.basis for p in envelope.per_person))
        left = budget_left(envelope.budget)
        if left:
            parts.append(left)
        bounded = bounding_note(envelope.bounding)
        if bounded:
            parts.append(bounded)
        chosen = self._accuracy.partition_selection
        if chosen:
            parts.append(
                f"keys chosen from the data: kept where noisy units ≥ {chosen.threshold} "
                f"(δ={format_exact(chosen.delta)})"
            )
        dominated, may = (0, 0) if self.dry_run else self._dominated_count()
        if dominated or may:
            said = []
            if dominated:
                said.append(f"noise dominates {_cells(dominated)}")
            if may:
                said.append(f"may dominate {_cells(may)}" if dominated else
                            f"noise may dominate {_cells(may)}")  # fmt: skip
            parts.append(", ".join(said) + ": read them as noise, not facts")
        if self.dry_run:
            parts.extend(dominance_warnings(envelope.plan))
        shown = len(self._shown_rows())
        if shown < len(self.rows):
            parts.append(f"showing {shown} of {len(self.rows)} rows")
        return " · ".join(parts)

    def budget_note(self) -> builtins.dict[str, Any] | None:
        """What the status bar shows: this notebook's ε left, if the gate said."""
        view = self.envelope.budget.notebook
        if view is None or self.mock:
            return None
        return {
            "notebook": self.notebook or "",
            "dataset": self.dataset,
            "epsilon_left": view.remaining.epsilon,
            "epsilon_limit": view.limit.epsilon,
        }

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> tuple[builtins.dict[str, str], builtins.dict[str, Any]]:
        """HTML for notebooks, Markdown for viewers that strip HTML's styles, plain text
        for terminals; this notebook's ε left in the metadata, for the status bar."""
        data = {
            "text/html": self._repr_html_(),
            "text/markdown": self._repr_markdown_(),
            "text/plain": repr(self),
        }
        note = self.budget_note()
        return data, ({BUDGET_METADATA: note} if note else {})

    def _repr_html_(self) -> str:
        body = self._plan_html() if self.dry_run else self._table_html()
        banner = (
            f'<div class="dpm-mock" title="{escape(MOCK_MEANING)}">'
            f"<strong>{escape(MOCK_LABEL)}</strong></div>"
            if self.mock
            else ""
        )
        return (
            f'<div class="dpmagic dpmagic-result">{STYLE}{banner}{body}{self._footer_html()}</div>'
        )

    def _footer_html(self) -> str:
        bars = []
        budget = self.envelope.budget
        for scope, view in (("notebook", budget.notebook), ("user", budget.user)):
            if view is None or not view.limit.epsilon:
                continue
            this = 0.0 if self.replayed or self.dry_run else self.envelope.cost.epsilon
            bar = budget_bar(view.spent.epsilon, view.limit.epsilon, this, scope)
            bars.append(f'<span class="dpm-muted">{scope}</span>{bar} ')
        return (
            f'<div class="dpmagic-footer" style="{MUTED}">'
            f'<span class="dpm-footer-text">{escape(self.footer())}</span> '
            f'<div class="dpm-bars">{"".join(bars)}</div></div>'
        )

    def _table_html(self) -> str:
        percent = f"{self.confidence:.0%}"
        inline = self.intervals == "inline"
        hover = self.intervals == "hover"
        noisy = False
        body = []
        for r in self._shown_rows():
            cells = []
            for c, value in enumerate(self.rows[r]):
                text = escape(format_value(value))
                shown = self._cell(c, r)
                if shown is None:
                    cells.append(f"<td>{text}</td>")
                    continue
                noisy = True
                if inline:
                    extra = (
                        f" ± {format_value(shown.half_width)}"
                        if shown.half_width is not None
                        else f" ({shown.short})"
                    )
                    text += escape(extra)
                elif hover:
                    # A space before the hidden span: where a viewer drops the style that
                    # hides it, the interval reads "424 [136, 712]", not "424[136, 712]".
                    text += (
                        f' <span class="dpm-int" style="display:none">{escape(shown.short)}</span>'
                    )
                else:
                    text += f' <span class="dpm-int">{escape(shown.short)}</span>'
                if shown.flag:
                    text += f' <span class="dpm-flag">{escape(shown.flag)}</span>'
                classes = "dpm-noisy dpm-dominated" if shown.dominated else "dpm-noisy"
                cells.append(f'<td class="{classes}" title="{escape(shown.tip)}">{text}</td>')
            body.append(cells)
        toggle = (
            f'<details class="dpm-toggle"><summary>{percent} intervals</summary></details>'
            if noisy and body and hover
            else ""
        )
        return toggle + table(self.columns, body, raw=True)

    def _plan_html(self) -> str:
        out = ""
        for headers, rows in self._plan_tables():
            head = "".join(f'<th title="{escape(tip)}">{escape(h)}</th>' for h, tip in headers)
            body = "".join(
                "<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>" for row in rows
            )
            out += f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return out

    def _plan_rows(self) -> list[list[str]]:
        return plan_rows(
            self.envelope.plan, zcdp=self.envelope.cost.rho is not None, fmt=format_exact
        )

    def _plan_tables(self) -> list[tuple[tuple[tuple[str, str], ...], list[list[str]]]]:
        """The dry run's tables: the noisy aggregates, then each output column's expected
        error (when the gate sent it)."""
        tables: list[tuple[tuple[tuple[str, str], ...], list[list[str]]]]
        tables = [(PLAN_HEADERS, self._plan_rows())]
        outputs = output_rows(self.envelope.plan, format_value)
        if outputs:
            tables.append((OUTPUT_HEADERS, outputs))
        return tables

    def _text_rows(self) -> list[list[str]]:
        """The shown rows as text with each interval beside its value: a plain view's table."""
        out = []
        for r in self._shown_rows():
            row = []
            for c, value in enumerate(self.rows[r]):
                text = format_value(value)
                shown = self._cell(c, r)
                if shown is not None:
                    text += f" {shown.short}"
                    if shown.flag:
                        text += f" ({shown.flag})"
                row.append(text)
            out.append(row)
        return out

    def _repr_markdown_(self) -> str:
        parts = [f"**{MOCK_LABEL}**\n"] if self.mock else []
        if self.dry_run:
            for headers, rows in self._plan_tables():
                parts.append(markdown_table([h for h, _ in headers], rows) + "\n")
        else:
            rows = self._text_rows()
            parts.append(markdown_table(self.columns, rows) if rows else "(no rows)")
        parts.append(f"\n_{markdown_escape(self.footer())}_")
        return "\n".join(parts)

    def __repr__(self) -> str:
        if self.dry_run:
            text = "\n\n".join(
                pd.DataFrame(rows, columns=[h for h, _ in headers]).to_string(index=False)
                for headers, rows in self._plan_tables()
            )
        else:
            frame = pd.DataFrame(self._text_rows(), columns=self.columns)
            text = frame.to_string(index=False) if len(frame) else "(no rows)"
        banner = f"{MOCK_LABEL}\n" if self.mock else ""
        if not self.dry_run and any(
            self._cell(c, r) is not None
            for r in self._shown_rows()
            for c in range(len(self.columns))
        ):
            # In a terminal or a plain log a bare noisy -53 reads as a fact.
            text += f"\n({self.confidence:.0%} intervals beside each noisy value)"
        return f"{banner}{text}\n{self.footer()}"


PLAN_HEADERS = HEADERS


def bounding_note(bounding: Bounding | None) -> str:
    """The footer's words on contribution bounding: the bounds every answer is over
    (the gate's ``bounding`` statement), and the bounding report when one was bought."""
    if bounding is None:
        return ""
    unit = bounding.unit
    bounds = []
    if bounding.rows_per_unit:
        bounds.append(f"≤ {_rows(bounding.rows_per_unit)} per {unit}")
    elif bounding.rows_per_group:
        groups = bounding.groups_per_unit
        bounds.append(
            f"≤ {_rows(bounding.rows_per_group)} per {unit} and group"
            + (f", ≤ {groups} groups" if groups and groups > 1 else "")
        )
    for clamp in bounding.clamps:
        lo, hi = clamp.bounds
        bounds.append(f"{clamp.aggregate} clamped to [{format_value(lo)}, {format_value(hi)}]")
    note = "over bounded data: " + "; ".join(bounds) if bounds else ""
    left = bounding.left_out
    if isinstance(left, LeftOut):
        rows, units = left.rows, left.units
        note += (
            f" · left out by the bounds: {_whole(rows.value)} rows "
            f"[{_whole(rows.interval[0])}, {_whole(rows.interval[1])}] "
            f"(≤ {left.cap} counted per {unit}) of {_whole(units.value)} {unit}s "
            f"[{_whole(units.interval[0])}, {_whole(units.interval[1])}]"
        )
    return note


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _whole(value: Any) -> str:
    """A noisy count, with thousands separators."""
    return f"{round(float(value)):,}"


def _frame(cells: pa.Table, fields: dict[tuple[int, str], int], columns: list[str]) -> pd.DataFrame:
    """The answer's DataFrame from its Arrow columns, as ``pd.DataFrame(rows)`` makes it
    from the JSON reply's rows (a column of JSON texts, ``wire.ENCODING``, as its values)."""
    data = {}
    for j in range(len(columns)):
        index = fields.get((j, "value"))
        meta = {} if index is None else cells.schema.field(index).metadata or {}
        if index is None or meta.get(wire.ENCODING) == b"json":
            data[j] = pd.Series(wire.values(cells, fields, j), dtype=object)
        else:
            data[j] = cells.column(index).to_pandas()
    frame = pd.DataFrame(data, index=pd.RangeIndex(cells.num_rows))
    frame.columns = pd.Index(columns)  # by position: two columns may share a name
    return frame
