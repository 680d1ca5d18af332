"""``%%dpsql`` and friends: the notebook's face of the gate.

Everything here runs in the untrusted kernel and only talks to the gate
through :class:`dpmagic.client.Gate`. Options come from the magic line or
from ``%config DpSql.*``; every failure becomes a ``UsageError`` so the cell
fails with one line that says why, never a traceback.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    line_cell_magic,
    line_magic,
    magics_class,
    no_var_expand,
)
from IPython.display import display
from traitlets import Bool, Float, Int, Unicode, observe

from dpmagic.client import Gate, connect
from dpmagic.errors import DPError
from dpmagic.progress import Interrupted, Progress, wait_for
from dpmagic.result import BudgetView, DatasetBudget, DPResult, SchemaView
from dpmagic.settings import load_project_settings
from dpmagic.templates import bind_templates
from dpmagic.transcript import TranscriptGate

ERROR_PREFIX = {
    "refused": "query refused: ",
    "budget": "not enough privacy budget: ",
    "auth": "the gate refused access: ",
    "bad_request": "bad request: ",
    "failed": "gate error: ",
}
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
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


FLAGS = {"--dry-run": "dry_run", "--fresh": "fresh"}
VALUED = {
    "-e": "epsilon",
    "--epsilon": "epsilon",
    "-d": "delta",
    "--delta": "delta",
    "--dataset": "dataset",
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
            setattr(opts, VALUED[name], _option_value(VALUED[name], name, inline))
        elif re.match(r"--?[A-Za-z]", token):
            raise UsageError(f"unknown option {name}; see %dpsql?")
        else:
            break
        i += 1
    rest = text[tokens[i].start() :] if i < len(tokens) else ""
    return opts, rest


def _option_value(field: str, name: str, raw: str) -> float | str:
    if field in ("epsilon", "delta"):
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"option {name} needs a number, not {raw!r}") from None
        if not (value > 0 or (field == "delta" and value == 0)) or value == float("inf"):
            raise UsageError(f"option {name} must be a positive number, not {raw!r}")
        return value
    if field == "out" and not IDENTIFIER.fullmatch(raw):
        raise UsageError(f"option {name} needs a Python variable name, not {raw!r}")
    return raw


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


def notebook_name(user_ns: dict[str, Any]) -> str:
    """The notebook the kernel claims to run: a sub-budget key, not an identity."""
    return os.environ.get("JPY_SESSION_NAME") or str(user_ns.get("__session__") or "unnamed")


@contextmanager
def gate_errors() -> Iterator[None]:
    """Turn every gate failure into a one-line ``UsageError``."""
    try:
        yield
    except DPError as exc:
        prefix = ERROR_PREFIX.get(exc.kind, "")
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

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._client: Gate | TranscriptGate | None = None

    @observe("gate", "token", "timeout")
    def _forget_client(self, change: Any) -> None:
        self._client = None

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
    def notebook(self) -> str:
        return notebook_name(self.shell.user_ns)

    @no_var_expand
    @line_cell_magic
    def dpsql(self, line: str, cell: str | None = None) -> DPResult:
        """Run differentially private SQL through the gate and show the noisy answer.

            %%dpsql [-e EPS] [-d DELTA] [--dataset NAME] [--dry-run] [--fresh] [-o VAR] [VAR <<]
            SELECT ...

            %dpsql [options] SELECT ...

        -e/--epsilon EPS   privacy cost of this query (default: DpSql.epsilon, then the policy's)
        -d/--delta DELTA   δ of this query, for (ε, δ) accountants
        --dataset NAME     dataset to query (default: DpSql.dataset, then the gate's only one)
        --dry-run          show the plan and what it would cost; nothing is charged
        --fresh            spend again instead of replaying a stored answer
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
        sql, as_strings = bind_templates(sql)
        params = self._parameters(sql, as_strings)
        notebook = self.notebook
        with gate_errors():
            client = self.client
            result = self._wait(
                client,
                lambda: client.query(
                    sql,
                    epsilon=opts.epsilon if opts.epsilon is not None else self.epsilon,
                    delta=opts.delta if opts.delta is not None else self.delta,
                    dataset=opts.dataset or self.dataset,
                    notebook=notebook,
                    dry_run=opts.dry_run,
                    fresh=opts.fresh,
                    params=params or None,
                ),
            )
        result.display_limit = self.displaylimit or None
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
        self.shell.user_ns[target] = value
        if self.feedback:
            print(f"stored in {target} ({what})")

    def _parameters(self, sql: str, as_strings: set[str]) -> dict[str, Any]:
        """Values of the SQL's ``$name`` parameters that the notebook defines.

        Names it does not define are left out, so the gate's refusal names
        them. A name written as the string literal ``'{{name}}'`` must hold a
        string: binding, say, a number there would change the query's types.
        """
        ns = self.shell.user_ns
        values = {name: _plain(name, ns[name]) for name in parameter_names(sql) if name in ns}
        for name in as_strings & values.keys():
            if not isinstance(values[name], str):
                raise UsageError(
                    f"'{{{{{name}}}}}' is a string literal but {name} is a "
                    f"{type(values[name]).__name__}; write {{{{{name}}}}} without the quotes"
                )
        return values

    @line_magic
    def dpbudget(self, line: str) -> BudgetView:
        """Show the privacy budget and this notebook's queries, per dataset.

        %dpbudget [--dataset NAME]

        For each dataset (only NAME when given, else DpSql.dataset, else all
        the gate serves): what you and this notebook have spent and have left,
        as a table with bars, then this notebook's queries in order (time,
        query, cost, whether it was replayed at no cost) and a chart of its
        cumulative ε against its limit. Nothing is charged.
        """
        opts, rest = parse_line(line)
        if rest.strip():
            raise UsageError(f"%dpbudget takes only --dataset, not {rest.strip()!r}")
        dataset = opts.dataset or self.dataset
        with gate_errors():
            history = self.client.history(dataset, self.notebook)
            views = [
                DatasetBudget(
                    budget=self.client.budget(name, self.notebook),
                    history=[e for e in history["entries"] if e.get("dataset") == name],
                )
                for name in history["datasets"]
            ]
        return BudgetView(views, self.notebook)

    @line_magic
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
    for problem in problems:
        print(f"dpmagic: [tool.dpmagic] in {path}: {problem}", file=sys.stderr)
    if path is not None and magics.feedback:
        print(f"dpmagic: settings from [tool.dpmagic] in {path}")
    ipython.register_magics(magics)
