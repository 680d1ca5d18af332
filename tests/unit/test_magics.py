"""The magics in a real IPython shell without a gate: their arguments, their usage errors,
and what they say when no gate answers (tests/system/test_magics.py runs them against
one)."""

# ruff: noqa: F811 - the shell fixtures are tests/shells.py's

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError

from dpmagic.magics.dpsql import parameter_names, parse_line, split_assignment
from tests.shells import COUNT_BY_SEX, ipython, shell  # noqa: F401


def test_unreachable_gate_is_a_usage_error_naming_it(shell, short_dir: Path):
    address = f"unix:{short_dir / 'nobody.sock'}"
    shell.run_line_magic("config", f"DpSql.gate = {address!r}")
    with pytest.raises(UsageError, match=f"no gate answers at {address}"):
        shell.run_cell_magic("dpsql", "", COUNT_BY_SEX)


def test_no_gate_configured_says_how_to_set_one(shell):
    with pytest.raises(UsageError, match="DPMAGIC_GATE"):
        shell.run_line_magic("dpbudget", "")


def test_bad_options_are_usage_errors(shell):
    for line, reason in [
        ("-e", "needs a value"),
        ("-e zero", "needs a number"),
        ("-e -1", "positive"),
        ("--nope", "unknown option --nope"),
        ("-o 1x", "variable name"),
        ("-o a b <<", "name different variables"),
    ]:
        with pytest.raises(UsageError, match=reason):
            shell.run_cell_magic("dpsql", line, COUNT_BY_SEX)
    with pytest.raises(UsageError, match="no SQL"):
        shell.run_cell_magic("dpsql", "-e 0.5", "\n")


def test_the_line_is_not_expanded_from_python_variables(shell):
    """`{name}` and `$name` belong to the SQL; IPython must not substitute them."""
    shell.user_ns["name"] = "result"
    with pytest.raises(UsageError, match=r"variable name, not '\{name\}'"):
        shell.run_line_magic("dpsql", "-o {name} SELECT 1")
    with pytest.raises(UsageError, match=r"variable name, not '\$name'"):
        shell.run_line_magic("dpsql", "-o $name SELECT 1")


def test_parse_line_stops_at_the_sql_and_keeps_it_verbatim():
    opts, rest = parse_line("-e 0.5 --dataset=d --fresh SELECT 'a  b' AS \"x\" WHERE y > -1")
    assert (opts.epsilon, opts.dataset, opts.fresh, opts.dry_run) == (0.5, "d", True, False)
    assert rest == "SELECT 'a  b' AS \"x\" WHERE y > -1"
    assert parse_line("-- SELECT 1")[1] == "SELECT 1"


def test_bounding_report_takes_a_share_between_0_and_1():
    assert parse_line("--bounding-report 0.1 SELECT 1")[0].bounding_report == 0.1
    for bad in ("0", "1", "1.5", "half", "-0.2"):
        with pytest.raises(UsageError):
            parse_line(f"--bounding-report {bad} SELECT 1")


def test_split_assignment_and_parameters():
    assert split_assignment("  x << SELECT 1") == ("x", " SELECT 1")
    assert split_assignment("SELECT 1 << 2") == (None, "SELECT 1 << 2")
    sql = "SELECT COUNT(*) FROM t WHERE a > $lo AND b = '$not' AND a < $hi AND c = $lo"
    assert parameter_names(sql) == ["lo", "hi"]


@pytest.mark.parametrize(
    "cell, line",
    [
        ("%dpsql --nope SELECT 1", "unknown option --nope; see %dpsql?"),
        ("%%dpsql --with nope\nSELECT 1", "no snippet nope; saved: none yet"),  # snippets.py's
        ("%dpplot", "no %%dpsql answer yet; store one with -o VAR"),
    ],
)
def test_a_refused_cell_fails_with_its_message_alone(shell, capsys, cell, line):
    """IPython prints its own UsageError as ``UsageError: message``, which reads as the
    magic crashing; the magics' refusals show as their one line, and the cell still
    fails (``error_in_exec``), so Run All, nbclient and graders stop there. With
    IPython's class (the broken version) the first check fails."""
    outcome = shell.run_cell(cell)
    shown = capsys.readouterr()
    first = next(s for s in (shown.out + shown.err).splitlines() if s.strip())
    assert first.startswith(line)
    assert "UsageError" not in shown.out + shown.err and "Traceback" not in shown.out + shown.err
    assert not outcome.success and isinstance(outcome.error_in_exec, UsageError)
    assert type(outcome.error_in_exec).__name__ == "UsageError"  # a kernel's ename


def test_the_demo_prints_a_refusal_as_the_notebook_shows_it() -> None:
    """A magic's refusal is a UsageError whose message is the whole line; the demo's
    transcript prints that line alone, any other error with its class's name."""
    from dpmagic.commands.demo import _texts

    refused = {"output_type": "error", "ename": "UsageError", "evalue": "query refused: x"}
    other = {"output_type": "error", "ename": "ValueError", "evalue": "bad"}
    assert list(_texts([refused, other])) == ["query refused: x", "ValueError: bad"]
