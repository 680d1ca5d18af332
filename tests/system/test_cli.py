"""The ``dpmagic`` command, run as users run it: in a subprocess where it serves.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_cli.py, the clinic fixtures both use in tests/clinic.py."""

# ruff: noqa: F811 - the clinic fixtures are tests/clinic.py's

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpmagic.client.http_gate import Gate
from dpmagic.commands.cli import main
from dpmagic.commands.demo import GateProcess, example_file, prepare_example
from dpmagic.commands.init_policy import unfilled
from tests.clinic import clinic_csv, spent_gate  # noqa: F401


def _dpmagic(
    *args: str, timeout: float = 60, module: bool = False
) -> subprocess.CompletedProcess[str]:
    """``dpmagic ARGS``, or ``python ARGS`` when ``module``."""
    return subprocess.run(
        [sys.executable, *(args if module else ("-m", "dpmagic", *args))],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_serve_refuses_a_skeleton_until_the_owner_fills_it(
    tmp_path: Path, clinic_csv: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's path from a CSV file to a served policy, step by step."""
    out = tmp_path / "policy.toml"
    source = str(clinic_csv["visits"])
    assert main(["init", "--from", source, "--privacy-unit", "patient_id", "-o", str(out)]) == 0
    capsys.readouterr()
    skeleton = out.read_text()
    todo = unfilled(skeleton)
    assert "visits.patient_id (type)" in todo  # a CSV declares no types
    assert "visits.cost (type, lower, upper, public_values)" in todo
    refused = _dpmagic("serve", "--policy", str(out))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    for item in todo:
        assert item in refused.stderr
    # The owner chooses the types and declares what they know of the domain, and
    # drops the rest (those columns stay "str").
    declared = {
        "patient_id": 'type = "int"',
        "cost": 'type = "float", lower = 0, upper = 50000',
        "diagnosis": 'type = "str", public_values = ["checkup", "asthma"]',
    }
    lines = []
    for line in skeleton.splitlines():
        name = line.split(" = ", 1)[0]
        if name in declared:
            line = f"{name} = {{ {declared[name]} }}"
        lines.append(line.split("  # TODO(dpmagic init)", 1)[0])
    out.write_text("\n".join(lines) + "\n")
    assert unfilled(out.read_text()) == []
    with GateProcess(out, tmp_path / "gate.sock", tmp_path / "gate.log") as gate:
        answer = Gate(gate.address).query(
            "SELECT diagnosis, AVG(cost) AS c FROM visits GROUP BY diagnosis", epsilon=1.0
        )
    assert sorted(answer.df["diagnosis"]) == ["asthma", "checkup"]


def _init_at_a_terminal(
    args: list[str], answers: list[str], cwd: Path, timeout: float = 60
) -> tuple[int, str]:
    """``dpmagic init ARGS`` on a pseudo-terminal, as an owner runs it: each answer is
    typed once its question shows (readline drops what is typed ahead of a prompt).
    The exit status and everything the terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "init", *args],
        stdin=slave, stdout=slave, stderr=slave, cwd=cwd, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    shown, pending, deadline = b"", list(answers), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal: it has ended
                    break
                if not chunk:
                    break
                shown += chunk
            # A question ends in "? " or "? [default] ", with the answer typed after it.
            asked = len(re.findall(rb"\? (?:\[[^\]\n]*\] )?(?=$|[^\r\n])", shown))
            while asked > len(answers) - len(pending) and pending:
                os.write(master, (pending.pop(0) + "\n").encode())
        return proc.wait(timeout=timeout), shown.decode().replace("\r\n", "\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_init_at_a_terminal_asks_per_table_and_the_gate_serves_its_answers(
    tmp_path: Path,
) -> None:
    """A DuckDB file declaring visits.patient → people.person_id and a key from rx to a
    visit: at a terminal ``init`` asks, per table, which column holds the person
    (offering the declared key, rx's a chain through visits) and its rows per person
    (offering 1 where the data has one), and a real gate serves the answers: the joins
    through the links are answered."""
    import duckdb

    shop = tmp_path / "shop.duckdb"
    con = duckdb.connect(str(shop))
    con.execute("CREATE TABLE people (person_id INTEGER PRIMARY KEY, sex VARCHAR)")
    con.execute(
        "CREATE TABLE visits (visit_id INTEGER PRIMARY KEY, "
        "patient INTEGER REFERENCES people (person_id), cost DOUBLE)"
    )
    con.execute("CREATE TABLE rx (visit_id INTEGER REFERENCES visits (visit_id), drug VARCHAR)")
    con.execute("INSERT INTO people SELECT range, ['F', 'M'][range % 2 + 1] FROM range(400)")
    con.execute("INSERT INTO visits SELECT range, range % 400, range % 70 FROM range(1000)")
    con.execute("INSERT INTO rx SELECT range, 'a' FROM range(10)")
    con.close()
    status, shown = _init_at_a_terminal(
        ["--from", "shop.duckdb", "--privacy-unit", "person_id", "-o", "policy.toml"],
        ["", "", "", "", ""],
        tmp_path,
    )
    assert status == 0, shown
    assert "people: each person_id has one row in the data (400 of them): one row per" in shown
    assert "visits: which column holds the person? [patient=people.person_id]" in shown
    assert (
        "visits: rows per patient in the data (400 of them): median 2, 99% have at most 3" in shown
    )
    # rx's key names a visit, whose person the gate reads along it: a chain, offered.
    assert "rx: which column holds the person? [visit_id=visits.visit_id]" in shown
    policy = tmp_path / "policy.toml"
    text = policy.read_text()
    assert 'links = { patient = "people.person_id" }' in text
    assert 'links = { visit_id = "visits.visit_id" }' in text
    assert "max_rows_per_unit = 1 " in text and "max_rows_per_unit = 3 " in text
    # The owner declares what they know of the domain, and serves it.
    text = text.replace(
        'sex = { type = "str" }', 'sex = { type = "str", public_values = ["F", "M"] }'
    )
    text = text.replace("response_quantum_ms = 250", "response_quantum_ms = 0")
    # Room for the two queries below (the skeleton's notebook budget is ε 3).
    text = text.replace(
        "notebook_budget = { epsilon = 3.0 }", "notebook_budget = { epsilon = 6.0 }"
    )
    policy.write_text("\n".join(line.split("  # TODO(dpmagic init)")[0]
                                for line in text.splitlines()) + "\n")  # fmt: skip
    assert unfilled(policy.read_text()) == []
    with GateProcess(policy, tmp_path / "gate.sock", tmp_path / "gate.log") as gate:
        client = Gate(gate.address)
        answer = client.query(
            "SELECT p.sex, COUNT(*) AS n FROM visits AS v JOIN people AS p "
            "ON v.patient = p.person_id GROUP BY p.sex",
            epsilon=1.0,
        )
        chained = client.query(
            "SELECT COUNT(*) AS n FROM rx JOIN visits ON rx.visit_id = visits.visit_id",
            epsilon=5.0,
        )
        schema = client.schema()
    # 10 prescriptions, one a person: noise of scale at most 3 / 5 (fails ~1e-8).
    assert abs(chained.rows[0][0] - 10) <= 12
    assert sorted(answer.df["sex"]) == ["F", "M"]
    for n in answer.df["n"]:  # 500 visits each; ±9 is a 95% error at 3 rows a person
        assert abs(n - 500) <= 60
    assert schema["count_error"]["tables"]["people"] == {"ungrouped": 3, "grouped": 3}


def test_serve_the_bundled_example_says_how_to_get_its_data(tmp_path: Path) -> None:
    refused = _dpmagic("serve", "--policy", str(example_file("clinic.toml")))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "python -m dpmagic.examples.clinic DIR" in refused.stderr
    # What it says works: the data and the policy, served.
    made = _dpmagic("-m", "dpmagic.examples.clinic", str(tmp_path), "--patients", "20", module=True)
    assert made.returncode == 0, made.stderr
    with GateProcess(tmp_path / "clinic.toml", tmp_path / "g.sock", tmp_path / "g.log") as gate:
        assert Gate(gate.address).health()


def test_bad_policy_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[gate]\naccountant = "magic"\n')
    for args in (
        ["serve", "--policy", str(bad)],
        ["budget", "show", "--policy", str(bad)],
        ["audit", "--policy", str(tmp_path / "missing.toml")],
    ):
        done = _dpmagic(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("dpmagic: error:")
        assert done.stderr.count("\n") == 1
        assert done.stdout == ""


def test_bad_option_is_exit_2() -> None:
    assert _dpmagic("demo", "--patients", "0").returncode == 2
    assert _dpmagic("frobnicate").returncode == 2


def test_serve_prints_address_and_stops_on_sigterm(tmp_path: Path) -> None:
    policy = prepare_example(tmp_path, patients=50)
    sock = tmp_path / "gate.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpmagic",
            "serve",
            "--policy",
            str(policy),
            "--listen",
            f"unix:{sock}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dpmagic gate listening on"), (
            proc.stderr.read() if proc.stderr else ""
        )
        assert f"unix:{sock}" in line
        assert Gate(f"unix:{sock}").health()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_budget_show(spent_gate: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "show", "--policy", str(spent_gate), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_notebook = {r["notebook"]: r for r in rows}
    assert set(by_notebook) == {"(all notebooks)", "a.ipynb", "b.ipynb"}
    assert {r["user"] for r in rows} == {rows[0]["user"]}
    total = by_notebook["(all notebooks)"]
    assert total["spent_epsilon"] == pytest.approx(0.75)
    assert total["remaining_epsilon"] == pytest.approx(9.25)
    assert by_notebook["a.ipynb"]["spent_epsilon"] == pytest.approx(0.25)
    assert by_notebook["b.ipynb"]["limit_epsilon"] == pytest.approx(3.0)

    assert main(["budget", "show", "--policy", str(spent_gate)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["dataset", "budget", "user"]
    assert len(table) == 2 + len(rows)
    assert any("a.ipynb" in line and "0.250" in line for line in table)

    assert main(["budget", "show", "--policy", str(spent_gate), "--user", "nobody"]) == 0
    assert capsys.readouterr().out.strip() == "no budget spent yet"
