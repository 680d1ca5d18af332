"""The ``dpmagic`` command: run a gate, try the example, set up kernels, admin views.

Errors a user can fix (a bad policy, a missing file, an option out of range)
are reported as one line, ``dpmagic: error: …``, with exit status 2, the same
convention argparse uses for usage errors, so scripts can tell "you asked
wrongly" (2) from "it ran and failed" (1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dpmagic.gate.policy import Policy, PolicyError, load_policy

if TYPE_CHECKING:
    from dpmagic.gate.ledger import Ledger

USAGE_ERROR = 2
LEDGER_FILE = "ledger.sqlite3"
ALL_NOTEBOOKS = "(all notebooks)"
AUDIT_COLUMNS = ("id", "time", "user", "dataset", "notebook", "epsilon", "status", "sql")


class CommandError(Exception):
    """A one-line reason to stop with exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (CommandError, PolicyError) as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpmagic",
        description="Differentially private SQL for Jupyter: the gate and its tools.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the gate", description=_serve.__doc__)
    p.add_argument("--policy", type=Path, required=True, help="the policy TOML file")
    p.add_argument(
        "--listen", help="unix:PATH or tcp:HOST:PORT (default: the policy's gate.listen)"
    )
    p.set_defaults(run=_serve)

    p = sub.add_parser(
        "demo", help="run the example notebook against a gate", description=_demo.__doc__
    )
    p.add_argument("--keep", type=Path, metavar="DIR", help="work in DIR and keep it afterwards")
    p.add_argument("--patients", type=_positive, default=5000, help="patients to generate")
    p.set_defaults(run=_demo)

    p = sub.add_parser(
        "lab", help="JupyterLab with a gate and the gated kernel", description=_lab.__doc__
    )
    p.add_argument("--policy", type=Path, help="serve this policy instead of the example")
    p.add_argument("--port", type=_positive, help="JupyterLab's port")
    p.add_argument("--patients", type=_positive, default=5000, help="patients in the example")
    p.add_argument(
        "--no-browser", action="store_true", help="do not open a browser (remote or headless)"
    )
    p.set_defaults(run=_lab)

    p = sub.add_parser("kernel", help="manage the gated kernelspec", description="Kernelspecs.")
    ksub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    k = ksub.add_parser(
        "install", help="install the gated kernelspec", description=_kernel_install.__doc__
    )
    where = k.add_mutually_exclusive_group()
    where.add_argument(
        "--user", action="store_true", help="install for the current user (the default)"
    )
    where.add_argument("--sys-prefix", action="store_true", help="install into sys.prefix")
    k.add_argument("--prefix", help="install under this prefix (e.g. a virtualenv's)")
    k.add_argument("--gate", metavar="ADDR", help="gate address for the kernel (DPMAGIC_GATE)")
    k.set_defaults(run=_kernel_install)

    p = sub.add_parser(
        "init", help="write a policy skeleton from data files", description=_init.__doc__
    )
    p.add_argument("data", nargs="+", type=Path, metavar="DATA", help="CSV or Parquet files")
    p.add_argument(
        "--privacy-unit", required=True, metavar="COL", help="the column identifying a person"
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="the policy file to write")
    p.add_argument("--dataset", help="dataset name (default: from the output file's name)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.set_defaults(run=_init)

    p = sub.add_parser("budget", help="privacy budgets in the ledger", description="Budgets.")
    bsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    b = bsub.add_parser("show", help="spent and remaining budget", description=_budget_show.__doc__)
    _admin_options(b)
    b.set_defaults(run=_budget_show)

    p = sub.add_parser("audit", help="the query log", description=_audit.__doc__)
    _admin_options(p)
    p.add_argument("--limit", type=_positive, default=50, help="most recent entries (default 50)")
    p.set_defaults(run=_audit)
    return parser


def _admin_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", type=Path, required=True, help="the gate's policy TOML file")
    p.add_argument("--dataset", help="only this dataset")
    p.add_argument("--user", help="only this user")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _serve(args: argparse.Namespace) -> int:
    """Run the gate for a policy until SIGTERM or SIGINT, then exit 0."""
    policy = load_policy(args.policy)
    from dpmagic.gate.server import serve

    return serve(policy, args.listen)


def _demo(args: argparse.Namespace) -> int:
    """Generate the example clinic, start a gate on it as a separate process and
    execute the quickstart notebook through a real kernel, printing each cell's
    noisy results and the budget left."""
    from dpmagic.demo import run_demo

    return run_demo(keep=args.keep, patients=args.patients)


def _lab(args: argparse.Namespace) -> int:
    """Start a gate (on the example clinic unless --policy) and JupyterLab with
    the gated kernel; the gate stops when JupyterLab exits."""
    from dpmagic.lab import LabUnavailable, run_lab

    try:
        return run_lab(
            policy=args.policy, port=args.port, patients=args.patients, browser=not args.no_browser
        )
    except LabUnavailable as exc:
        raise CommandError(str(exc)) from None


def _kernel_install(args: argparse.Namespace) -> int:
    """Install the gated kernelspec: a python3 kernel with dpmagic loaded."""
    from dpmagic.kernel import install

    where = install(
        user=not args.sys_prefix, sys_prefix=args.sys_prefix, prefix=args.prefix, gate=args.gate
    )
    print(f"installed the dpmagic kernelspec in {where}")
    return 0


def _init(args: argparse.Namespace) -> int:
    """Write a policy skeleton from the schema (names and types) of data files.
    No data value is read into it: declare bounds and public values yourself."""
    from dpmagic.init_policy import InitError, write_skeleton

    try:
        out = write_skeleton(
            args.data, args.privacy_unit, args.output, dataset=args.dataset, force=args.force
        )
    except InitError as exc:
        raise CommandError(str(exc)) from None
    print(f"wrote {out}: declare the bounds and public values marked '?' before serving it")
    return 0


def _budget_show(args: argparse.Namespace) -> int:
    """Privacy budget spent and remaining, per user and notebook, from the ledger."""
    policy = load_policy(args.policy)
    rows = budget_rows(policy, _datasets(policy, args.dataset), args.user)
    return _emit(rows, args.json, empty="no budget spent yet")


def _audit(args: argparse.Namespace) -> int:
    """The most recent queries the gate answered or refused after a debit, newest first."""
    policy = load_policy(args.policy)
    rows = audit_rows(policy, _datasets(policy, args.dataset), args.user, args.limit)
    if not args.json:
        # The SQL goes last: it is the one long column; times to the second.
        rows = [{k: r.get(k) for k in AUDIT_COLUMNS} for r in rows]
        for row in rows:
            row["time"] = str(row["time"])[:19].replace("T", " ")
    return _emit(rows, args.json, empty="no queries recorded yet")


def budget_rows(policy: Policy, datasets: list[str], user: str | None) -> list[dict[str, object]]:
    """One row per user (all notebooks) and per notebook, for each dataset."""
    with _ledger(policy) as ledger:
        if ledger is None:
            return []
        from dpmagic.gate.accounting import make_accountant

        rows: list[dict[str, object]] = []
        for name in datasets:
            ds = policy.datasets[name]
            accountant = make_accountant(ds.accountant)
            seen: dict[str, set[str]] = {}
            for entry in ledger.history(user=user, dataset=name, notebook=None, limit=None):
                seen.setdefault(str(entry["user"]), set()).add(str(entry["notebook"]))
            for who in sorted(seen):
                scopes = [(ALL_NOTEBOOKS, None, ds.user_budget)]
                scopes += [(nb, nb, ds.notebook_budget) for nb in sorted(seen[who])]
                for label, notebook, limit in scopes:
                    view = accountant.view(ledger.spent(who, name, notebook), limit)
                    used, left = view["spent"], view["remaining"]
                    row: dict[str, object] = {
                        "dataset": name,
                        "user": who,
                        "notebook": label,
                        "spent_epsilon": used["epsilon"],
                        "limit_epsilon": limit.epsilon,
                        "remaining_epsilon": left["epsilon"],
                    }
                    if ds.accountant != "pure":
                        row.update(
                            spent_delta=used["delta"],
                            limit_delta=limit.delta,
                            remaining_delta=left["delta"],
                        )
                    if "rho" in used:
                        row.update(spent_rho=used["rho"], remaining_rho=left["rho"])
                    rows.append(row)
        return rows


def audit_rows(
    policy: Policy, datasets: list[str], user: str | None, limit: int
) -> list[dict[str, object]]:
    """The ledger's history, newest first, across the chosen datasets."""
    with _ledger(policy) as ledger:
        if ledger is None:
            return []
        rows = [
            dict(entry)
            for name in datasets
            for entry in ledger.history(user=user, dataset=name, notebook=None, limit=limit)
        ]
    rows.sort(key=lambda r: r["id"], reverse=True)
    return rows[:limit]


@contextlib.contextmanager
def _ledger(policy: Policy) -> Iterator[Ledger | None]:
    """The gate's ledger, or None if no query was ever recorded (never creates one)."""
    path = policy.gate.state_dir / LEDGER_FILE
    if not path.exists():
        yield None
        return
    from dpmagic.gate.accounting import make_accountant
    from dpmagic.gate.ledger import Ledger

    ledger = Ledger(path, make_accountant(policy.gate.accountant))
    try:
        yield ledger
    finally:
        ledger.close()


def _datasets(policy: Policy, name: str | None) -> list[str]:
    return sorted(policy.datasets) if name is None else [policy.dataset(name).name]


def _emit(rows: list[dict[str, object]], as_json: bool, empty: str) -> int:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
    elif rows:
        print(format_table(rows))
    else:
        print(empty)
    return 0


def format_table(rows: list[dict[str, object]]) -> str:
    """Aligned columns, numbers right-aligned, for reading in a terminal."""
    heads = list(rows[0])
    cells = [[_cell(row.get(h)) for h in heads] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(heads)]
    numeric = [all(isinstance(row.get(h), int | float) for row in rows) for h in heads]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(heads), line(["-" * w for w in widths]), *map(line, cells)])


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 and value else f"{value:.3f}"
    return " ".join(str(value).split())
