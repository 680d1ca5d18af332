"""The ``dpmagic`` command, run as users run it: in a subprocess where it serves."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import duckdb
import pytest

from dpmagic.cli import main
from dpmagic.client import Gate
from dpmagic.demo import GateProcess, example_file, prepare_example
from dpmagic.examples.clinic import generate
from dpmagic.gate.policy import load_policy
from dpmagic.init_policy import unfilled


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


@pytest.fixture
def clinic_csv(tmp_path: Path) -> dict[str, Path]:
    return generate(tmp_path / "clinic", patients=60)


def test_help_for_every_command() -> None:
    for args in (
        [],
        ["serve"],
        ["demo"],
        ["lab"],
        ["kernel", "install"],
        ["init"],
        ["budget", "show"],
        ["audit"],
    ):
        with pytest.raises(SystemExit) as done:
            main([*args, "--help"])
        assert done.value.code == 0


def test_init_writes_types_not_values(
    tmp_path: Path, clinic_csv: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "clinic.toml"
    files = [str(p) for p in clinic_csv.values()]
    assert main(["init", *files, "--privacy-unit", "patient_id", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    text = out.read_text()
    raw = tomllib.loads(text)
    visits = raw["datasets"]["clinic"]["tables"]["visits"]["columns"]
    assert visits["patient_id"] == {"type": "int"}
    assert visits["cost"] == {"type": "float"}
    assert visits["stay_days"] == {"type": "int"}
    assert visits["diagnosis"] == {"type": "str"}
    assert 'cost = { type = "float" }  # TODO(dpmagic init): lower = ?, upper = ?' in text
    # Named for the folder the files share, not for the policy file.
    assert raw["datasets"]["clinic"]["sources"] == {
        "patients": "clinic/patients.csv",
        "visits": "clinic/visits.csv",
    }
    # Schema only: no category, no number from the data made it into the file.
    for value in ('"checkup"', '"CA"', '"medicare"', '"F"', "2019", "2024"):
        assert value not in text
    policy = load_policy(out)
    assert policy.dataset("clinic").privacy_unit == "patient_id"
    assert out.stat().st_mode & 0o777 == 0o600  # the gate's file, nobody else's


def test_init_from_one_file_names_the_dataset_after_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = generate(tmp_path / "d", patients=30, fmt="parquet")["visits"]
    out = tmp_path / "policy.toml"
    assert main(["init", "--from", str(data), "--privacy-unit", "patient_id", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    policy = load_policy(out)
    assert list(policy.datasets) == ["visits"]  # not "policy"
    assert "dataset 'visits'" in said and f"dpmagic serve --policy {out}" in said
    columns = policy.dataset("visits").tables["visits"].columns
    assert columns["cost"].type == "float" and columns["department"].type == "str"


def test_init_on_real_microdata_writes_no_value_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PUMS with 1 to 4 rows per person: every column typed, and none of its
    values (incomes, ages) in the skeleton, which only the owner may fill."""
    data = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "PUMS_dup.csv"
    if not data.is_file():
        pytest.skip("../shared (real microdata) is absent")
    out = tmp_path / "policy.toml"
    assert main(["init", "--from", str(data), "--privacy-unit", "pid", "-o", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text()
    columns = load_policy(out).dataset("pums_dup").tables["pums_dup"].columns
    assert set(columns) == {"age", "sex", "educ", "race", "income", "married", "pid"}
    assert {c.type for c in columns.values()} == {"int"}
    assert all(c.lower is None and c.public_values is None for c in columns.values())
    numbers = set(re.findall(r"\d+", text))
    values = duckdb.sql(f"SELECT DISTINCT income::VARCHAR FROM '{data}' WHERE income >= 100")
    assert not numbers & {v for (v,) in values.fetchall()}
    assert len(unfilled(text)) == 6  # every column but the privacy unit


def test_init_without_privacy_unit_lists_the_columns(
    tmp_path: Path, clinic_csv: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.toml"
    assert main(["init", "--from", str(clinic_csv["patients"]), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--privacy-unit" in err and err.count("\n") == 1
    for column in ("patient_id", "age", "insurance"):
        assert column in err
    assert not out.exists()
    assert main(["init", "-o", str(out), "--privacy-unit", "x"]) == 2
    assert "--from FILE" in capsys.readouterr().err


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
    assert "visits.cost (lower, upper)" in todo and "visits.diagnosis (public_values)" in todo
    refused = _dpmagic("serve", "--policy", str(out))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    for item in todo:
        assert item in refused.stderr
    # The owner declares what they know of the domain, and drops the rest.
    declared = {
        "cost": "lower = 0, upper = 50000",
        "diagnosis": 'public_values = ["checkup", "asthma"]',
    }
    lines = []
    for line in skeleton.splitlines():
        name = line.split(" = ", 1)[0]
        if name in declared:
            line = line.split(" }", 1)[0] + f", {declared[name]} }}"
        lines.append(line.split("  # TODO(dpmagic init)", 1)[0])
    out.write_text("\n".join(lines) + "\n")
    assert unfilled(out.read_text()) == []
    with GateProcess(out, tmp_path / "gate.sock", tmp_path / "gate.log") as gate:
        answer = Gate(gate.address).query(
            "SELECT diagnosis, AVG(cost) AS c FROM visits GROUP BY diagnosis", epsilon=1.0
        )
    assert sorted(answer.df["diagnosis"]) == ["asthma", "checkup"]


def test_serve_the_bundled_example_says_how_to_get_its_data(tmp_path: Path) -> None:
    refused = _dpmagic("serve", "--policy", str(example_file("clinic.toml")))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "python -m dpmagic.examples.clinic DIR" in refused.stderr
    # What it says works: the data and the policy, served.
    made = _dpmagic("-m", "dpmagic.examples.clinic", str(tmp_path), "--patients", "20", module=True)
    assert made.returncode == 0, made.stderr
    with GateProcess(tmp_path / "clinic.toml", tmp_path / "g.sock", tmp_path / "g.log") as gate:
        assert Gate(gate.address).health()


def test_init_refuses_to_overwrite(
    tmp_path: Path, clinic_csv: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "policy.toml"
    out.write_text("# mine\n")
    args = ["init", str(clinic_csv["visits"]), "--privacy-unit", "patient_id", "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpmagic: error:") and "--force" in err and err.count("\n") == 1
    assert out.read_text() == "# mine\n"
    assert main([*args, "--force"]) == 0
    assert "visits" in load_policy(out).dataset(None).tables


def test_init_needs_the_privacy_unit(
    tmp_path: Path, clinic_csv: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "policy.toml"
    args = ["init", str(clinic_csv["visits"]), "--privacy-unit", "person", "-o", str(out)]
    assert main(args) == 2
    assert "person" in capsys.readouterr().err
    assert not out.exists()


def test_init_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["init", str(tmp_path / "nope.csv"), "--privacy-unit", "id", "-o", str(tmp_path / "p")]
    assert main(args) == 2
    assert "no such file" in capsys.readouterr().err


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


@pytest.fixture(scope="module")
def spent_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gate's policy whose ledger holds real queries: two charged, one replayed."""
    workdir = tmp_path_factory.mktemp("ledger")
    policy = prepare_example(workdir, patients=80)
    with GateProcess(policy, workdir / "gate.sock", workdir / "gate.log") as gate:
        client = Gate(gate.address)
        client.query("SELECT COUNT(*) AS n FROM visits", epsilon=0.25, notebook="a.ipynb")
        client.query("SELECT COUNT(*) AS n FROM visits", epsilon=0.25, notebook="a.ipynb")
        client.query(
            "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", epsilon=0.5, notebook="b.ipynb"
        )
    return policy


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
    assert table[0].split()[:3] == ["dataset", "user", "notebook"]
    assert len(table) == 2 + len(rows)
    assert any("a.ipynb" in line and "0.250" in line for line in table)

    assert main(["budget", "show", "--policy", str(spent_gate), "--user", "nobody"]) == 0
    assert capsys.readouterr().out.strip() == "no budget spent yet"


def test_audit(spent_gate: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--policy", str(spent_gate), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    sqls = [r["sql"] for r in rows]
    assert sqls.count("SELECT COUNT(*) AS n FROM visits") == 2  # charged, then replayed
    assert "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex" in sqls

    assert main(["audit", "--policy", str(spent_gate), "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # header, rule, newest entry

    assert main(["audit", "--policy", str(spent_gate), "--dataset", "nope"]) == 2
    assert "unknown dataset" in capsys.readouterr().err


def test_admin_views_before_any_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = prepare_example(tmp_path, patients=10)
    assert main(["audit", "--policy", str(policy)]) == 0
    assert capsys.readouterr().out.strip() == "no queries recorded yet"
    assert main(["budget", "show", "--policy", str(policy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert not (tmp_path / "state" / "ledger.sqlite3").exists()


def test_lab_without_jupyterlab_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The test extra installs JupyterLab; hide it to see what a plain install says.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "jupyterlab" else find_spec(name, *a),
    )
    assert main(["lab"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dpmagic: error: JupyterLab is not installed: pip install 'dpmagic[lab]'"
    )


def test_kernel_install_into_a_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["kernel", "install", "--prefix", str(tmp_path), "--gate", "unix:/nowhere/gate.sock"]
    assert main(args) == 0
    where = Path(capsys.readouterr().out.split(" in ", 1)[1].strip())
    assert where.is_relative_to(tmp_path)
    spec = json.loads((where / "kernel.json").read_text())
    assert spec["env"]["DPMAGIC_GATE"] == "unix:/nowhere/gate.sock"
