"""``%%dpsql`` and friends: the notebook's face of the gate.

Everything here runs in the untrusted kernel and only talks to the gate
through :class:`dpmagic.client.http_gate.Gate`. Options come from the magic line or
from ``%config DpSql.*``; every failure becomes a ``UsageError`` so the cell
fails with one line that says why, never a traceback: this module's
``UsageError``, which IPython shows as its message alone (IPython prints its own
as ``UsageError: message``, which reads as a crash of the magic rather than the
gate's answer), and which still fails the cell, so that nbclient, "Run All" and a
grader stop at it as before.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic import (
    Magics,
    line_cell_magic,
    line_magic,
    magics_class,
    no_var_expand,
)
from IPython.display import display
from traitlets import Bool, Enum, Float, Int, Unicode, observe

from dpmagic.client.errors import BudgetExhausted, DPError
from dpmagic.client.http_gate import Gate, connect
from dpmagic.client.identity import notebook_name
from dpmagic.client.settings import load_project_settings
from dpmagic.client.transcript import TranscriptGate
from dpmagic.display.budget import BudgetView, DatasetBudget
from dpmagic.display.plot import KINDS
from dpmagic.display.result import DPResult
from dpmagic.display.schema import SchemaView
from dpmagic.magics.completion import Sources, make_matcher
from dpmagic.magics.progress import Interrupted, Progress, wait_for
from dpmagic.magics.snippets import Snippets
from dpmagic.magics.templates import bind_templates


class UsageError(IPythonUsageError):
    """A refusal or a misuse, shown as its one line (``query refused: …``).

    IPython prints the ``UsageError`` it defines as ``UsageError: message`` on
    stderr, and prints any other exception as a traceback unless it renders its own
    (``_render_traceback_``, which IPython asks of every exception but its own
    ``UsageError``): so this subclass renders its message alone, as the notebook's
    error output (its traceback is that one line). It keeps IPython's class name, so a
    kernel's reply still names it ``UsageError`` (nbclient's ``CellExecutionError``
    and graders read that), and is still one: ``except UsageError`` catches it."""

    def _render_traceback_(self) -> list[str]:
        return [" ".join(str(self).split())]


Magic = TypeVar("Magic", bound=Callable[..., Any])


def one_line(method: Magic) -> Magic:
    """``method`` with IPython's own ``UsageError`` (raised by the snippets and
    templates it calls) raised as this module's, so that it shows as one line too."""

    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except UsageError:
            raise
        except IPythonUsageError as exc:
            raise UsageError(str(exc)) from None

    return wrapped  # type: ignore[return-value]


ERROR_PREFIX = {
    "mock": "mock run failed ",
    "refused": "query refused: ",
    "budget": "not enough privacy budget: ",
    "auth": "the gate refused access: ",
    "bad_request": "bad request: ",
    "failed": "gate error: ",
}
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
COMPLETION_TIMEOUT_S = 2.0
"""A completion waits this long for the schema at most: a keystroke must not hang."""
ASSIGN = re.compile(r"\s*([A-Za-z_]\w*)\s*<<")
# `$name` outside string literals and quoted identifiers: a query parameter.
QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
PARAMETER = re.compile(r"\$([A-Za-z_]\w*)")


@dataclass
class QueryOptions:
    """What a ``%dpsql`` line may say; ``None`` falls back to ``%config``."""

    epsilon: float | None = None
    delta: float | None = None
    dataset: str | None = None
    dry_run: bool = False
    fresh: bool = False
    out: str | None = None
    accuracy: float | None = None
    alpha: float | None = None
    mock: bool = False
    mock_rows: int | None = None
    save: str | None = None
    with_: list[str] = field(default_factory=list)
    bounding_report: float | None = None
    max_groups: int | None = None
    max_rows: int | None = None
    clip: float | None = None


FLAGS = {"--dry-run": "dry_run", "--fresh": "fresh", "--mock": "mock"}
VALUED = {
    "--mock-rows": "mock_rows",
    "--save": "save",
    "--with": "with_",
    "-e": "epsilon",
    "--epsilon": "epsilon",
    "-d": "delta",
    "--delta": "delta",
    "--dataset": "dataset",
    "--accuracy": "accuracy",
    "--alpha": "alpha",
    "--bounding-report": "bounding_report",
    "--max-groups": "max_groups",
    "--max-rows": "max_rows",
    "--clip": "clip",
    "-o": "out",
    "--out": "out",
}


def parse_line(text: str) -> tuple[QueryOptions, str]:
    """Split leading options off ``text``; the rest is returned verbatim.

    A hand-written scanner rather than argparse/shlex: the SQL after the
    options must keep its quotes, and a number such as ``-1`` in it must not
    be mistaken for an option.
    """
    opts = QueryOptions()
    tokens = list(re.finditer(r"\S+", text))
    i = 0
    while i < len(tokens):
        token = tokens[i].group()
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        if token == "--":
            i += 1
            break
        if name in FLAGS and not eq:
            setattr(opts, FLAGS[name], True)
        elif name in VALUED:
            if not eq:
                if i + 1 >= len(tokens):
                    raise UsageError(f"option {name} needs a value")
                i += 1
                inline = tokens[i].group()
            value = _option_value(VALUED[name], name, inline)
            if VALUED[name] == "with_":
                opts.with_.append(str(value))
            else:
                setattr(opts, VALUED[name], value)
        elif re.match(r"--?[A-Za-z]", token):
            raise UsageError(f"unknown option {name}; see %dpsql?")
        else:
            break
        i += 1
    rest = text[tokens[i].start() :] if i < len(tokens) else ""
    return opts, rest


def _option_value(field: str, name: str, raw: str) -> float | int | str:
    if field in ("epsilon", "delta", "accuracy", "alpha", "bounding_report", "clip"):
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"option {name} needs a number, not {raw!r}") from None
        if not (value > 0 or (field == "delta" and value == 0)) or value == float("inf"):
            raise UsageError(f"option {name} must be a positive number, not {raw!r}")
        if field in ("alpha", "bounding_report", "clip") and value >= 1:
            raise UsageError(f"option {name} must be between 0 and 1, not {raw!r}")
        return value
    if field in ("mock_rows", "max_groups", "max_rows", "rows"):
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise UsageError(f"option {name} needs a whole number ≥ 1, not {raw!r}")
        return int(raw)
    if field in ("out", "save", "with_") and not IDENTIFIER.fullmatch(raw):
        what = "a Python variable name" if field == "out" else "a snippet name (an SQL identifier)"
        raise UsageError(f"option {name} needs {what}, not {raw!r}")
    return raw


@dataclass
class BudgetOptions:
    """What a ``%dpbudget`` line may say."""

    dataset: str | None = None
    preview: bool = False
    accuracy: float | None = None
    rows: int | None = None

    @property
    def previewed(self) -> bool:
        """Whether the preview is asked for: ``--preview``, or its ``--accuracy`` or
        ``--rows``."""
        return self.preview or self.accuracy is not None or self.rows is not None


BUDGET_VALUED = {"--dataset": "dataset", "--accuracy": "accuracy", "--rows": "rows"}


def parse_budget_line(text: str) -> BudgetOptions:
    """``%dpbudget``'s options (``--preview``, ``--name value`` or ``--name=value``), each
    checked as ``%%dpsql`` checks its own; anything else is an error that says what it
    takes."""
    opts = BudgetOptions()
    tokens = text.split()
    i = 0
    while i < len(tokens):
        name, eq, raw = tokens[i].partition("=")
        if tokens[i] == "--preview":
            opts.preview = True
            i += 1
            continue
        if name not in BUDGET_VALUED:
            raise UsageError(
                "%dpbudget takes only --dataset NAME, --preview, --accuracy A and --rows N, "
                f"not {tokens[i]!r}"
            )
        if not eq:
            if i + 1 >= len(tokens):
                raise UsageError(f"option {name} needs a value")
            i += 1
            raw = tokens[i]
        setattr(opts, BUDGET_VALUED[name], _option_value(BUDGET_VALUED[name], name, raw))
        i += 1
    return opts


def split_assignment(sql: str) -> tuple[str | None, str]:
    """``x << SELECT …`` → ("x", "SELECT …"); anything else is left alone."""
    match = ASSIGN.match(sql)
    if match is None:
        return None, sql
    return match.group(1), sql[match.end() :]


def parameter_names(sql: str) -> list[str]:
    """The ``$name`` parameters of ``sql``, in order, ignoring quoted text."""
    names = PARAMETER.findall(QUOTED.sub(" ", sql))
    return list(dict.fromkeys(names))


def _plain(name: str, value: Any) -> Any:
    """A parameter as a JSON scalar; numpy scalars become Python ones."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise UsageError(f"parameter ${name} must be a number, a string, a boolean or None")


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


@contextmanager
def gate_errors() -> Iterator[None]:
    """Turn every gate failure into a one-line ``UsageError``."""
    try:
        yield
    except DPError as exc:
        prefix = ERROR_PREFIX.get(exc.kind, "")
        if isinstance(exc, BudgetExhausted) and exc.budget:
            prefix = exc.which() + ": "
        raise UsageError(prefix + " ".join(str(exc).split())) from None


@magics_class
class DpSql(Magics):
    """Differentially private SQL against a dpmagic gate."""

    gate = Unicode(
        None,
        allow_none=True,
        help="Gate address, `unix:/path/gate.sock` or `http://host:port`; "
        "unset means $DPMAGIC_GATE.",
    ).tag(config=True)
    token = Unicode(
        None, allow_none=True, help="Bearer token for a TCP gate; unset means $DPMAGIC_TOKEN."
    ).tag(config=True)
    dataset = Unicode(None, allow_none=True, help="Dataset queried when a cell names none.").tag(
        config=True
    )
    epsilon = Float(
        None, allow_none=True, help="ε per query when a cell gives no -e; unset: the policy's."
    ).tag(config=True)
    delta = Float(None, allow_none=True, help="δ per query when a cell gives no -d.").tag(
        config=True
    )
    displaylimit = Int(50, help="Rows shown in a result's table; 0 shows all.").tag(config=True)
    autopandas = Bool(
        False, help="-o VAR / VAR << store the pandas DataFrame instead of the DPResult."
    ).tag(config=True)
    autopolars = Bool(
        False, help="-o VAR / VAR << store a polars DataFrame instead of the DPResult."
    ).tag(config=True)
    feedback = Bool(True, help="Say where results are stored and which gate is used.").tag(
        config=True
    )
    timeout = Float(120.0, help="Seconds to wait for the gate's reply.").tag(config=True)
    intervals = Enum(
        ["shown", "hover", "inline"],
        "shown",
        help="shown: each noisy cell's 95% interval beside its value; hover: intervals in "
        "tooltips and behind a toggle; inline: value ± half-width in every noisy cell. "
        "Cells noise dominates are flagged in each.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        # Set first: configuration applied by the base class fires the observers below.
        self._client: Gate | TranscriptGate | None = None
        self._schemas: dict[str | None, dict[str, Any] | None] = {}
        self.snippets = Snippets()
        self._last: DPResult | None = None
        super().__init__(shell=shell, **kwargs)

    @observe("gate", "token", "timeout")
    def _forget_client(self, change: Any) -> None:
        self._client = None
        self._schemas.clear()

    def completion_schema(self) -> dict[str, Any] | None:
        """The public schema for completion, fetched once per gate and dataset; None
        without a gate (completion then offers keywords, functions and options only)."""
        key = self.dataset
        if key not in self._schemas:
            try:
                client = connect(self.gate, self.token, timeout=COMPLETION_TIMEOUT_S)
                self._schemas[key] = client.schema(self.dataset)
            except DPError:
                return None
        return self._schemas[key]

    @observe("autopandas", "autopolars")
    def _one_frame_kind(self, change: Any) -> None:
        # As in JupySQL: turning one on turns the other off.
        if change["new"]:
            other = "autopolars" if change["name"] == "autopandas" else "autopandas"
            setattr(self, other, False)

    @property
    def client(self) -> Gate | TranscriptGate:
        """The gate client for the current settings, made on first use."""
        if self._client is None:
            with gate_errors():
                self._client = connect(self.gate, self.token, timeout=self.timeout)
        return self._client

    @property
    def user_ns(self) -> dict[str, Any]:
        """The notebook's variables: a magic registered on a shell always has one."""
        if self.shell is None:
            raise UsageError("dpmagic's magics run in IPython: %load_ext dpmagic")
        return self.shell.user_ns

    @property
    def notebook(self) -> str:
        return notebook_name(self.user_ns)

    @no_var_expand
    @line_cell_magic
    @one_line
    def dpsql(self, line: str, cell: str | None = None) -> DPResult | None:
        """Run differentially private SQL through the gate and show the noisy answer.

            %%dpsql [-e EPS | --accuracy A [--alpha 0.05]] [-d DELTA] [--dataset NAME]
                    [--bounding-report SHARE] [--max-groups N] [--max-rows N] [--clip SHARE]
                    [--dry-run] [--fresh]
                    [--mock [--mock-rows N]] [--save NAME]
                    [--with NAME ...] [-o VAR] [VAR <<]
            SELECT ...

            %dpsql [options] SELECT ...

        -e/--epsilon EPS   privacy cost of this query (default: DpSql.epsilon, then the policy's)
        -d/--delta DELTA   δ of this query, for (ε, δ) accountants
        --accuracy A       instead of an ε: spend the least that makes every noisy
                           cell's interval ±A (COUNT and SUM outputs)
        --alpha ALPHA      the interval's level for --accuracy: 1 - ALPHA (default 0.05)
        --dataset NAME     dataset to query (default: DpSql.dataset, then the gate's only one)
        --bounding-report SHARE
                           spend SHARE (0 to 1) of this query's ε on a noisy count of
                           the rows the contribution bounds left out, shown in the footer
        --max-groups N     count each unit in at most N groups of this query (at most
                           the policy's max_partitions): less noise, more rows left out
        --max-rows N       count at most N rows of each unit per group (at most the
                           policy's max_rows_per_partition)
        --clip SHARE       spend SHARE (0 to 1) of the ε choosing, privately, the bounds the
                           values summed by SUM/AVG/VAR lie within and the rows each
                           person brings to a group, and answer within them with the
                           rest: less noise on skewed data and on joins, values beyond
                           moved to the bounds and rows beyond left out (each release
                           a query of its own in the history)
        --dry-run          show the plan and what it would cost; nothing is charged
        --fresh            spend again instead of replaying a stored answer
        --mock             answer on fake tables drawn from the public schema, in this
                           kernel: the query never reaches the gate, nothing is charged
        --mock-rows N      privacy units in the mock tables (default 1000)
        --save NAME        keep the cell's SQL as snippet NAME (it is not run)
        --with NAME        prefix the query with the saved snippet as `WITH NAME AS (…)`;
                           repeatable; the gate analyses the whole query
        -o VAR, VAR <<     also store the DPResult in VAR (VAR.df is the DataFrame)

        `$name` or `{{name}}` in the SQL is bound from the notebook variable
        `name` as a typed literal by the gate, never spliced into the text
        (`'{{name}}'` as a whole string literal binds a string). The same
        query asked again is replayed at no cost with the same numbers. A
        query that takes over a second shows how long it has waited;
        Kernel ▸ Interrupt stops waiting (the gate keeps the charge).
        With DpSql.autopandas or DpSql.autopolars, -o/<< store a DataFrame.
        """
        opts, rest = parse_line(line)
        sql = rest if cell is None else f"{rest}\n{cell}"
        target, sql = split_assignment(sql)
        if opts.out and target and opts.out != target:
            raise UsageError(f"-o {opts.out} and {target} << name different variables")
        target = opts.out or target
        if not sql.strip():
            raise UsageError("no SQL to run; write the query after %dpsql or below %%dpsql")
        if opts.save:
            self.snippets.save(opts.save, sql, opts.with_)
            if self.feedback:
                print(f"saved snippet {opts.save} (not run: use it with --with {opts.save})")
            return None
        sql = self.snippets.compose(sql, opts.with_)
        if opts.alpha is not None and opts.accuracy is None:
            raise UsageError("--alpha goes with --accuracy")
        if opts.accuracy is not None and opts.epsilon is not None:
            raise UsageError("give -e or --accuracy, not both")
        if opts.bounding_report is not None and (opts.accuracy is not None or opts.mock):
            raise UsageError("--bounding-report goes with an ε, not with --accuracy or --mock")
        epsilon = None if opts.accuracy is not None else _first(opts.epsilon, self.epsilon)
        sql, as_strings = bind_templates(sql)
        params = self._parameters(sql, as_strings)
        notebook = self.notebook
        with gate_errors():
            client = self.client
            if opts.mock:
                result = client.query(
                    sql,
                    dataset=opts.dataset or self.dataset,
                    params=params or None,
                    mock=True,
                    mock_rows=opts.mock_rows,
                )
            else:
                result = self._wait(
                    client,
                    lambda: client.query(
                        sql,
                        epsilon=epsilon,
                        delta=opts.delta if opts.delta is not None else self.delta,
                        dataset=opts.dataset or self.dataset,
                        notebook=notebook,
                        dry_run=opts.dry_run,
                        fresh=opts.fresh,
                        params=params or None,
                        accuracy=opts.accuracy,
                        alpha=opts.alpha,
                        bounding_report=opts.bounding_report,
                        max_partitions=opts.max_groups,
                        max_rows_per_partition=opts.max_rows,
                        clip=opts.clip,
                    ),
                )
        result.display_limit = self.displaylimit or None
        result.intervals = self.intervals
        result.notebook = notebook
        self._last = result
        if target:
            self._store(target, result)
        return result

    def _wait(self, client: Gate | TranscriptGate, request: Callable[[], DPResult]) -> DPResult:
        """The gate's reply, with progress shown while it is slow; interruptible."""
        handle = None

        def show(progress: Progress) -> None:
            nonlocal handle
            if handle is None:
                handle = display(progress, display_id=True)
            else:
                handle.update(progress)

        try:
            return wait_for(request, show, client.abort)
        except Interrupted as exc:
            raise UsageError(
                f"interrupted: stopped waiting for the gate after {exc.waited:.0f} s; "
                "a query that reached it stays charged, and running the cell again "
                "replays its answer at no cost once the gate has released it"
            ) from None

    def _store(self, target: str, result: DPResult) -> None:
        if self.autopolars:
            value, what = result.pl, "a polars DataFrame"
        elif self.autopandas:
            value, what = result.df, "a pandas DataFrame"
        else:
            value, what = result, "its .df is the DataFrame"
        self.user_ns[target] = value
        if self.feedback:
            print(f"stored in {target} ({what})")

    def _parameters(self, sql: str, as_strings: set[str]) -> dict[str, Any]:
        """Values of the SQL's ``$name`` parameters that the notebook defines.

        Names it does not define are left out, so the gate's refusal names
        them. A name written as the string literal ``'{{name}}'`` must hold a
        string: binding, say, a number there would change the query's types.
        """
        ns = self.user_ns
        values = {name: _plain(name, ns[name]) for name in parameter_names(sql) if name in ns}
        for name in as_strings & values.keys():
            if not isinstance(values[name], str):
                raise UsageError(
                    f"'{{{{{name}}}}}' is a string literal but {name} is a "
                    f"{type(values[name]).__name__}; write {{{{{name}}}}} without the quotes"
                )
        return values

    @line_magic
    @one_line
    def dpbudget(self, line: str) -> BudgetView:
        """Show the privacy budget and this notebook's queries, per dataset.

        %dpbudget [--dataset NAME] [--preview] [--accuracy A] [--rows N]

        For each dataset (only NAME when given, else DpSql.dataset, else all
        the gate serves): what you and this notebook have spent and have left,
        as a table with bars; with --preview (or --accuracy, or --rows), what
        more that allows, per kind of query (a count of the unit's table, the
        mean of each bounded column): how to ask for it, its 95% ±, what each
        costs and how many more fit, at the dataset's default ε and, with
        --accuracy, at ±A (a mean's over a group of N rows, default 1000);
        then this notebook's queries in order (time, query, cost, whether it
        was replayed at no cost) and a chart of its cumulative ε against its
        limit. Nothing is charged. The preview is asked for, not always shown:
        only a gate can plan it, so a plain %dpbudget graded from a transcript
        shows what it showed live (asked for there, the preview says it cannot).
        """
        opts = parse_budget_line(line)
        dataset = opts.dataset or self.dataset
        with gate_errors():
            history = self.client.history(dataset, self.notebook)
            views = [
                DatasetBudget(
                    budget=self.client.budget(
                        name,
                        self.notebook,
                        preview=opts.previewed,
                        accuracy=opts.accuracy,
                        rows=opts.rows,
                    ),
                    history=[e for e in history["entries"] if e.get("dataset") == name],
                )
                for name in history["datasets"]
            ]
        return BudgetView(views, self.notebook, preview=opts.previewed)

    @line_magic
    @one_line
    def dpplot(self, line: str) -> None:
        """Plot a result with its 95% intervals as error bars (needs matplotlib).

            %dpplot [bar|hist|line] [VAR] [--x COLUMN] [--y COLUMN]

        VAR is a variable holding a DPResult (`-o VAR`); without it, the last
        %%dpsql answer. The x axis defaults to the first group key, y to the
        first noisy column. A value where noise dominates is drawn hatched.
        """
        words = line.split()
        columns: dict[str, str] = {}
        for option in ("--x", "--y"):
            if option in words:
                at = words.index(option)
                if at + 1 >= len(words):
                    raise UsageError(f"option {option} needs a column name")
                columns[option[2:]] = words[at + 1]
                del words[at : at + 2]
        kind = words.pop(0) if words and words[0] in KINDS else "bar"
        if len(words) > 1:
            raise UsageError("usage: %dpplot [bar|hist|line] [VAR] [--x COLUMN] [--y COLUMN]")
        result = self.user_ns.get(words[0]) if words else self._last
        if not isinstance(result, DPResult):
            what = f"{words[0]} is not a %%dpsql result" if words else "no %%dpsql answer yet"
            raise UsageError(f"{what}; store one with -o VAR (not as a DataFrame) and plot VAR")
        try:
            # Drawn through pyplot, so the notebook shows the figure; returning the
            # Axes too would print its repr under it.
            result.plot(kind, x=columns.get("x"), y=columns.get("y"))
        except ImportError as exc:
            print(f"dpmagic: {exc}", file=sys.stderr)
        except (KeyError, ValueError) as exc:
            raise UsageError(str(exc).strip("'\"")) from None

    @line_magic
    @one_line
    def dpschema(self, line: str) -> SchemaView:
        """Show the tables that may be queried, their columns, bounds and the policy.

        %dpschema [--dataset NAME]
        """
        opts, rest = parse_line(line)
        if rest.strip():
            raise UsageError(f"%dpschema takes only --dataset, not {rest.strip()!r}")
        with gate_errors():
            reply = self.client.schema(opts.dataset or self.dataset)
        return SchemaView(reply)

    @line_magic
    @one_line
    def dpconnect(self, line: str) -> None:
        """Point this notebook at a gate and check that it answers.

            %dpconnect ADDRESS [--token TOKEN]

        ADDRESS is `unix:/path/to/gate.sock`, `http://host:port`, or
        `transcript:PATH` to answer only from a transcript of released answers.
        """
        tokens = line.split()
        token = None
        if "--token" in tokens:
            at = tokens.index("--token")
            if at + 1 >= len(tokens):
                raise UsageError("option --token needs a value")
            token = tokens[at + 1]
            del tokens[at : at + 2]
        if len(tokens) != 1:
            raise UsageError("usage: %dpconnect ADDRESS [--token TOKEN]")
        self.gate = tokens[0]
        if token is not None:
            self.token = token
        with gate_errors():
            if not self.client.health():
                raise UsageError(f"no gate answers at {self.gate}")
        if self.feedback:
            print(f"connected to the gate at {self.gate}")


def register(ipython: Any) -> None:
    """Register the magics with ``ipython`` (called by ``%load_ext dpmagic``).

    Defaults come from IPython's configuration, then from ``[tool.dpmagic]``
    in the nearest ``pyproject.toml``; ``%config DpSql.*`` overrides both.
    """
    magics = DpSql(ipython)
    path, problems = load_project_settings(magics, Path.cwd())
    _register_completer(ipython, magics)
    for problem in problems:
        print(f"dpmagic: [tool.dpmagic] in {path}: {problem}", file=sys.stderr)
    if path is not None and magics.feedback:
        print(f"dpmagic: settings from [tool.dpmagic] in {path}")
    ipython.register_magics(magics)


def _register_completer(ipython: Any, magics: DpSql) -> None:
    """Tab completion in ``%%dpsql`` cells, replacing any from an earlier load."""
    completer = getattr(ipython, "Completer", None)
    if completer is None:
        return
    matcher = make_matcher(
        Sources(
            schema=magics.completion_schema,
            options=lambda: [*FLAGS, *VALUED],
            snippets=lambda: list(magics.snippets),
        )
    )
    completer.custom_matchers[:] = [
        m for m in completer.custom_matchers if getattr(m, "__name__", "") != matcher.__name__
    ]
    completer.custom_matchers.append(matcher)
