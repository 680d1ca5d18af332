"""The ``dpmagic`` command: run a gate, try the example, set up kernels, admin views.

Errors a user can fix (a bad policy, a missing file, an option out of range)
are reported as one line, ``dpmagic: error: …``, with exit status 2, the same
convention argparse uses for usage errors, so scripts can tell "you asked
wrongly" (2) from "it ran and failed" (1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dpmagic.gate.failures import OwnerError
from dpmagic.gate.policy import Budget, Policy, PolicyError, load_policy

if TYPE_CHECKING:
    from dpmagic.commands.init_data import Data
    from dpmagic.gate.ledger.scopes import Scope

USAGE_ERROR = 2
CONSOLE_PORT = 8766


class CommandError(Exception):
    """A one-line reason to stop with exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from dpmagic.commands.supervisor import Stopped, exit_by_signal

    try:
        return args.run(args)
    except (CommandError, PolicyError, OwnerError) as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except Stopped as stop:
        # `lab` and `demo` have stopped their children and removed their
        # temporary folder by now; end the way the signal asked.
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print(f"dpmagic: {stop}: stopped everything it started", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        exit_by_signal(stop.signum)
        return 128 + stop.signum


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
    p.add_argument(
        "--jupyterhub",
        action="store_true",
        help="run as a JupyterHub service: users are known by their Hub API tokens, and "
        "the address defaults to the service's url ($JUPYTERHUB_SERVICE_URL)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        help="worker processes answering queries, each with its own engine over the same "
        "data and ledger (default: the policy's gate.workers, 1)",
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
    p.add_argument(
        "--port", type=_positive, help="JupyterLab's port (taken: an error, never another port)"
    )
    p.add_argument("--patients", type=_positive, default=5000, help="patients in the example")
    p.add_argument(
        "--no-browser", action="store_true", help="do not open a browser (remote or headless)"
    )
    p.add_argument(
        "--notebook-dir",
        type=Path,
        metavar="DIR",
        help="the folder of notebooks to serve (default: the current folder); "
        "nothing in it is removed when the lab stops",
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
    k.add_argument(
        "--autoload",
        action="store_true",
        help="also load dpmagic in every IPython kernel (e.g. python3) of the same prefix",
    )
    k.set_defaults(run=_kernel_install)

    p = sub.add_parser(
        "init",
        help="write a policy from data files or a DuckDB database",
        description=_init.__doc__,
    )
    p.add_argument(
        "data", nargs="*", type=Path, metavar="DATA", help="CSV or Parquet files, or a DuckDB file"
    )
    p.add_argument(
        "--from",
        dest="sources",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a CSV or Parquet file, one table, or a DuckDB database, all its tables "
        "(repeatable; the same as DATA)",
    )
    p.add_argument(
        "--privacy-unit",
        metavar="COL",
        help="the column identifying a person (left out: the columns are listed)",
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="the policy file to write")
    p.add_argument(
        "--dataset",
        help="dataset name (default: the file's name, or the folder several files share)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument(
        "--row-level",
        action="store_true",
        help="each row is one person: with --privacy-unit every table declares "
        "max_rows_per_unit = 1; without, each row is its own unit (a count's error "
        "at ε = 1 is then ±3, not the ±48 of 4 × 4 bounds)",
    )
    p.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="TABLE.COL=TABLE.COL",
        help="TABLE's rows belong to the person COL names, the other table's unit column "
        "(repeatable; a DuckDB file's declared foreign keys are offered without it)",
    )
    p.add_argument(
        "--unit",
        action="append",
        default=[],
        metavar="TABLE.COL",
        help="TABLE's column naming the person, where it is not called --privacy-unit",
    )
    p.add_argument(
        "--rows-per-unit",
        action="append",
        default=[],
        metavar="TABLE=N",
        help="the most rows one person has in TABLE (1: a row per person), or TABLE=none",
    )
    p.add_argument("--skip", action="append", default=[], metavar="TABLE", help="leave TABLE out")
    p.add_argument(
        "--spark-master",
        metavar="URL",
        help="read DATA given as table:NAME from the catalog of a Spark session on this "
        "master (local[2], spark://host:7077), as the gate will",
    )
    p.add_argument(
        "--spark-remote",
        metavar="URL",
        help="the same through Spark Connect (sc://host:15002)",
    )
    p.add_argument(
        "--spark-prepared",
        metavar="URI",
        help="with --spark-remote: the folder or URI on the cluster's storage where the gate "
        "keeps its prepared tables (readable by the gate alone)",
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of that Spark session, written into the policy too (repeatable)",
    )
    p.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="ask nothing: take each default, including the bounds suggested from the "
        "data's rows per unit",
    )
    p.set_defaults(run=_init)

    p = sub.add_parser("budget", help="privacy budgets in the ledger", description="Budgets.")
    bsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    b = bsub.add_parser("show", help="spent and remaining budget", description=_budget_show.__doc__)
    _admin_options(b)
    b.set_defaults(run=_budget_show)
    b = bsub.add_parser(
        "grant",
        help="raise a budget's limit (a user's, a notebook's, a group's or the dataset's)",
        description=_budget_grant.__doc__,
    )
    _change_options(b)
    b.add_argument("--epsilon", type=_amount, required=True, help="ε to add to the limit")
    b.add_argument("--delta", type=_amount, default=0.0, help="δ to add to the limit")
    b.set_defaults(run=_budget_grant)
    b = bsub.add_parser(
        "reset",
        help="start a budget's spending from zero",
        description=_budget_reset.__doc__,
    )
    _change_options(b)
    b.set_defaults(run=_budget_reset)

    p = sub.add_parser(
        "transcript", help="signed records of released answers", description="Transcripts."
    )
    tsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    t = tsub.add_parser(
        "export",
        help="what a user was released in a notebook",
        description=_transcript_export.__doc__,
    )
    t.add_argument("--policy", type=Path, required=True, help="the gate's policy TOML file")
    t.add_argument("--user", required=True, help="the notebook's author")
    t.add_argument("--notebook", required=True, help="the notebook's name, as the gate knows it")
    t.add_argument("-o", "--output", type=Path, required=True, help="the file to write")
    t.set_defaults(run=_transcript_export)
    t = tsub.add_parser(
        "verify", help="check a transcript's signature", description=_transcript_verify.__doc__
    )
    t.add_argument("--policy", type=Path, required=True, help="the gate's policy TOML file")
    t.add_argument("transcript", type=Path, help="the transcript file")
    t.set_defaults(run=_transcript_verify)

    p = sub.add_parser("console", help="the owner's web console", description=_console.__doc__)
    p.add_argument("--policy", type=Path, required=True, help="the gate's policy TOML file")
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)"
    )
    p.add_argument(
        "--port", type=_port, default=CONSOLE_PORT,
        help=f"the port (default {CONSOLE_PORT}; 0: any free port, printed)",
    )  # fmt: skip
    p.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="admin tokens ([users] name = token, mode 0600), each signing an admin in",
    )
    p.add_argument(
        "--jupyterhub",
        action="store_true",
        help="run as a JupyterHub service: the Hub's admins sign in through the Hub "
        "(the address is the service's url)",
    )
    p.add_argument(
        "--public-url",
        action="append",
        default=[],
        metavar="URL",
        help="a URL the console is reached at besides its own address (behind a TLS "
        "proxy that keeps the browser's Host); repeat for several. Other hosts get a 400",
    )
    p.set_defaults(run=_console)

    p = sub.add_parser("audit", help="the query log", description=_audit.__doc__)
    _admin_options(p)
    p.add_argument("--notebook", help="only this notebook")
    p.add_argument("--limit", type=_positive, default=50, help="most recent entries (default 50)")
    p.set_defaults(run=_audit)
    return parser


def _admin_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", type=Path, required=True, help="the gate's policy TOML file")
    p.add_argument("--dataset", help="only this dataset")
    p.add_argument("--user", help="only this user")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _change_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", type=Path, required=True, help="the gate's policy TOML file")
    p.add_argument("--dataset", help="the dataset (default: the policy's only one)")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="the user whose budget changes")
    who.add_argument("--group", help="the group whose budget changes (group_budgets)")
    who.add_argument(
        "--all-users",
        action="store_true",
        help="the dataset's own budget, shared by all users (dataset_budget)",
    )
    p.add_argument("--notebook", help="with --user: only this notebook's budget")
    p.add_argument(
        "--reason", "--note", dest="reason", required=True, help="why, for the audit log"
    )


def _amount(text: str) -> float:
    from dpmagic.gate import owner

    try:
        return owner.amount(text)
    except OwnerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {value}")
    return value


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
    _check_example_data(policy)
    from dpmagic.commands.init_policy import unfilled

    left = unfilled(policy.path.read_text())
    if left:
        raise CommandError(
            f"{policy.path.name} still has {len(left)} placeholder(s) from dpmagic init: "
            + "; ".join(left)
            + ". Declare each, or delete its TODO comment to serve the column without"
        )
    from dpmagic.gate.service.server import serve

    if args.jupyterhub and importlib.util.find_spec("jupyterhub") is None:
        raise CommandError("--jupyterhub needs JupyterHub: pip install 'dpmagic[hub]'")
    return serve(policy, args.listen, jupyterhub=args.jupyterhub, workers=args.workers)


def _check_example_data(policy: Policy) -> None:
    """Say how to get the bundled example's data when ``policy`` is that
    example without it: the data is generated, not shipped."""
    from dpmagic.commands.demo import example_file

    if policy.path.read_text() != example_file("clinic.toml").read_text():
        return
    missing = [p for ds in policy.datasets.values() for p in ds.sources.values() if not p.exists()]
    if missing:
        raise CommandError(
            f"{missing[0]} not found: this is the bundled example, whose data is generated; "
            "`python -m dpmagic.examples.clinic DIR` writes it and this policy into DIR, "
            "then run `dpmagic serve --policy DIR/clinic.toml`"
        )


def _demo(args: argparse.Namespace) -> int:
    """Generate the example clinic, start a gate on it as a separate process and
    execute the quickstart notebook through a real kernel, printing each cell's
    noisy results and the budget left."""
    from dpmagic.commands.demo import run_demo

    return run_demo(keep=args.keep, patients=args.patients)


def _lab(args: argparse.Namespace) -> int:
    """Start a gate (on the example clinic unless --policy) and JupyterLab with
    the gated kernel, serving the notebooks of the current folder (or
    --notebook-dir). When JupyterLab exits, or on SIGTERM, SIGHUP or SIGINT,
    everything started stops and the lab's own temporary folder is removed; the
    notebooks stay."""
    from dpmagic.commands.lab import LabError, run_lab

    try:
        return run_lab(
            policy=args.policy,
            port=args.port,
            patients=args.patients,
            browser=not args.no_browser,
            notebook_dir=args.notebook_dir,
        )
    except LabError as exc:
        raise CommandError(str(exc)) from None


def _kernel_install(args: argparse.Namespace) -> int:
    """Install the gated kernelspec: a python3 kernel with dpmagic loaded."""
    from dpmagic.kernel import install

    where = install(
        user=not args.sys_prefix, sys_prefix=args.sys_prefix, prefix=args.prefix, gate=args.gate
    )
    print(f"installed the dpmagic kernelspec in {where}")
    if args.autoload:
        from dpmagic.kernel import install_autoload

        config = install_autoload(sys_prefix=args.sys_prefix, prefix=args.prefix, gate=args.gate)
        print(f"IPython kernels load dpmagic from {config}")
    return 0


def _init(args: argparse.Namespace) -> int:
    """Write a policy from the schema (names and types) of data files or a DuckDB
    database. At a terminal it asks, per table, which column holds the person (offering
    the foreign keys a database declares) and the most rows one person has there
    (suggesting a bound from the data's rows per unit, shown to you alone); --yes takes
    each default, and without a terminal nothing is asked. No value of the data goes in:
    declare bounds and public values yourself, and a CSV's column types (a CSV declares
    none), where it says TODO(dpmagic init); serve refuses the file until you have."""
    from dpmagic.commands.init_policy import (
        InitError,
        check_output,
        parse_answers,
        plan,
        report,
        terminal,
        unfilled,
        untyped,
        write_plan,
    )

    files = [*args.sources, *args.data]
    if not files:
        raise CommandError("name the data: dpmagic init --from FILE --privacy-unit COL -o P")
    try:
        answers = parse_answers(
            args.unit, args.link, args.rows_per_unit, args.skip,
            yes=args.yes, row_level=args.row_level,
        )  # fmt: skip
        check_output(args.output, args.force)
        data = _init_data(files, args)
        settled = plan(data, args.privacy_unit, answers, terminal())
        out = write_plan(settled, args.output, dataset=args.dataset, force=args.force)
    except InitError as exc:
        raise CommandError(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C at a question: the owner's stop, not a fault
        print(f"\ndpmagic: init stopped: {args.output} not written", file=sys.stderr)
        return 130
    policy = load_policy(out)
    text = out.read_text()
    left = len(unfilled(text))
    print(
        f"wrote {out}: dataset {next(iter(policy.datasets))!r} "
        f"({', '.join(policy.dataset(None).tables)}); "
        f"settle its {left} TODO(dpmagic init) placeholder(s), then: "
        f"dpmagic serve --policy {out}"
    )
    for line in report(settled):
        print(line)
    choose = untyped(text)
    if choose:
        print(
            f"a CSV declares no column types, and its values must not choose them: "
            f'{len(choose)} column(s) are written "str" until you choose each type: '
            + ", ".join(choose)
        )
    return 0


def _init_data(files: list[Path], args: argparse.Namespace) -> Data:
    """The tables ``init`` reads: files or a DuckDB database, or (``table:NAME``) the
    tables of the Spark catalog ``--spark-master`` or ``--spark-remote`` reaches."""
    from dpmagic.commands.init_data import InitError
    from dpmagic.commands.init_policy import read_data
    from dpmagic.commands.init_spark import is_catalog_table, read_catalog
    from dpmagic.gate.policy import SparkConfig

    tables = [str(f) for f in files if is_catalog_table(str(f))]
    spark = args.spark_master or args.spark_remote
    if not tables:
        if spark or args.spark_conf or args.spark_prepared:
            raise InitError("the --spark options read table:NAME data")
        _reading(files)
        return read_data(files)
    if len(tables) != len(files):
        raise InitError("give catalog tables (table:NAME) or files, not both: a dataset reads one")
    if (args.spark_master is None) == (args.spark_remote is None):
        raise InitError("table:NAME is read through Spark: give --spark-master or --spark-remote")
    if args.spark_remote is not None and not args.spark_prepared:
        raise InitError(
            "--spark-remote needs --spark-prepared: the folder or URI on the cluster's "
            "storage where the gate keeps its prepared tables"
        )
    conf = []
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InitError(f"--spark-conf {item}: write KEY=VALUE")
        conf.append((key.strip(), value.strip()))
    config = SparkConfig(args.spark_master, args.spark_remote, tuple(conf), args.spark_prepared)
    _reading(files)
    return read_catalog(tables, config)


def _reading(files: list[Path]) -> None:
    """A line at a terminal before the data is read: finding keys takes seconds."""
    if len(files) > 1 and sys.stderr.isatty():
        print(
            f"dpmagic init: reading {len(files)} tables, and where they declare no foreign "
            "keys, looking for them in the data …",
            file=sys.stderr,
        )


def _budget_show(args: argparse.Namespace) -> int:
    """Privacy budget spent and remaining, from the ledger: the dataset's and each
    group's (where the policy sets them), each user's and each notebook's."""
    from dpmagic.gate import owner

    policy = load_policy(args.policy)
    with owner.open_ledger(policy) as ledger:
        rows = owner.budget_rows(policy, ledger, _datasets(policy, args.dataset), args.user)
    return _emit(rows, args.json, empty="no budget spent yet")


def _budget_grant(args: argparse.Namespace) -> int:
    """Raise a budget's limit on a dataset (a user's, one notebook's, a group's or the
    dataset's own) by an (ε, δ) amount, recorded in the audit log with who granted
    it and why."""
    from dpmagic.gate import owner

    policy = load_policy(args.policy)
    amount = Budget(args.epsilon, args.delta)
    change = owner.grant(_scope(policy, args), amount, owner.operator(), args.reason)
    with owner.open_ledger(policy, create=True) as ledger:
        assert ledger is not None
        owner.apply(ledger, change)
    print(change.describe())
    return 0


def _budget_reset(args: argparse.Namespace) -> int:
    """Forget what a budget (a user's, one notebook's, a group's or the dataset's own)
    spent and was granted, so the policy's limit applies afresh; recorded in the
    audit log with who and why. Answers already released stay replayable at no cost."""
    from dpmagic.gate import owner

    policy = load_policy(args.policy)
    change = owner.reset(_scope(policy, args), owner.operator(), args.reason)
    with owner.open_ledger(policy, create=True) as ledger:
        assert ledger is not None
        owner.apply(ledger, change)
    print(change.describe())
    return 0


def _scope(policy: Policy, args: argparse.Namespace) -> Scope:
    from dpmagic.gate import owner

    return owner.scope_of(
        policy,
        args.dataset,
        user=args.user,
        notebook=args.notebook,
        group=args.group,
        whole=args.all_users,
    )


def _transcript_export(args: argparse.Namespace) -> int:
    """Write a signed transcript of the answers released to a user in a notebook;
    with DPMAGIC_TRANSCRIPT=FILE, a kernel answers from it without a gate."""
    policy = load_policy(args.policy)
    from dpmagic.gate import owner
    from dpmagic.gate.service.signed_transcripts import TranscriptError, export

    with owner.open_ledger(policy) as ledger:
        if ledger is None:
            raise CommandError("the gate has released nothing yet")
        try:
            document = export(ledger, policy, args.user, args.notebook)
        except TranscriptError as exc:
            raise CommandError(str(exc)) from None
    # Released answers and the SQL that asked them: for the user and the grader only,
    # so readable by the exporter alone whatever the umask (and a file already there).
    try:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(document, indent=1, default=str) + "\n")
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc.strerror}") from None
    count = len(document["answers"])  # type: ignore[arg-type]
    print(f"wrote {args.output}: {count} answers released to {args.user} in {args.notebook!r}")
    return 0


def _transcript_verify(args: argparse.Namespace) -> int:
    """Check that a transcript was written by this gate and not changed since;
    exit 0 if so, 1 if not."""
    policy = load_policy(args.policy)
    from dpmagic.gate.service.signed_transcripts import (
        KEY_FILE,
        TranscriptError,
        signing_key,
        verify,
    )

    if not (policy.gate.state_dir / KEY_FILE).exists():
        raise CommandError("this gate has never exported a transcript")
    try:
        document = json.loads(args.transcript.read_text())
    except OSError as exc:
        raise CommandError(f"cannot read {args.transcript}: {exc.strerror}") from None
    except ValueError:
        raise CommandError(f"{args.transcript} is not JSON") from None
    try:
        verify(document, signing_key(policy.gate.state_dir))
    except TranscriptError as exc:
        print(f"{args.transcript}: {exc}", file=sys.stderr)
        return 1
    who = f"{document['user']}, notebook {document['notebook']!r}"
    print(f"{args.transcript}: signed by this gate for {who}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    """The most recent queries (charged, released, failed, replayed, or refused before
    the debit, with why) and budget grants and resets, newest first."""
    from dpmagic.gate import owner

    policy = load_policy(args.policy)
    with owner.open_ledger(policy) as ledger:
        rows = owner.audit_rows(
            ledger, _datasets(policy, args.dataset), args.user, args.limit, args.notebook
        )
    if not args.json:
        # The SQL goes last: it is the one long column; times to the second. A change to
        # a group's or the dataset's budget names it where a user's name would be.
        shown = []
        for r in rows:
            row = {k: r.get(k) for k in owner.AUDIT_COLUMNS}
            row["time"] = str(row["time"])[:19].replace("T", " ")
            if r.get("reason"):
                row["sql"] = f"{row['sql']}  [refused: {r['reason']}]"
            if r.get("scope") == "group":
                row["user"] = f"(group {r['user']})"
            elif r.get("scope") == "dataset":
                row["user"] = "(all users)"
            shown.append(row)
        rows = shown
    return _emit(rows, args.json, empty="no queries recorded yet")


def _console(args: argparse.Namespace) -> int:
    """Serve the owner's console, a web page over the gate's ledger and policy: the
    datasets and their policy, every budget with its spending over time, the query
    log, renewals, and grants and resets with a reason. Run it as the gate's user;
    it prints a login URL that signs one browser in, once. Until SIGTERM or SIGINT."""
    policy = load_policy(args.policy)
    if args.jupyterhub and importlib.util.find_spec("jupyterhub") is None:
        raise CommandError("--jupyterhub needs JupyterHub: pip install 'dpmagic[hub]'")
    from dpmagic.gate.console.serve import run
    from dpmagic.gate.service.auth import TokenFileError

    try:
        return run(
            policy,
            args.host,
            args.port,
            args.admin_token_file,
            args.jupyterhub,
            public=args.public_url,
        )
    except TokenFileError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot serve the console: {exc.strerror or exc}") from None


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
