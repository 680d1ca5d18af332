"""The ``dpmagic`` command, run as users run it: in a subprocess where it serves."""

# ruff: noqa: F811 - the clinic fixtures are tests/clinic.py's

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import tomllib
from pathlib import Path

import duckdb
import pytest

from dpmagic.commands.cli import main
from dpmagic.commands.demo import prepare_example
from dpmagic.commands.init_policy import unfilled, untyped
from dpmagic.examples.clinic import generate
from dpmagic.gate.policy import load_policy
from tests.clinic import clinic_csv, spent_gate  # noqa: F401


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
    said = capsys.readouterr().out
    assert "wrote" in said
    text = out.read_text()
    raw = tomllib.loads(text)
    visits = raw["datasets"]["clinic"]["tables"]["visits"]["columns"]
    # CSV files declare no types: each column is "str" until the owner chooses.
    assert {c["type"] for c in visits.values()} == {"str"}
    assert 'patient_id = { type = "str" }  # TODO(dpmagic init): type = ?  (' in text
    assert 'cost = { type = "str" }  # TODO(dpmagic init): type = ?, then lower = ?' in text
    assert "visits.cost (type, lower, upper, public_values)" in unfilled(text)
    assert "visits.patient_id" in untyped(text) and "patients.age" in untyped(text)
    assert ", ".join(untyped(text)) in said
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
    data = Path(__file__).resolve().parents[3] / "shared" / "data" / "PUMS_dup.csv"
    if not data.is_file():
        pytest.skip("../shared (real microdata) is absent")
    out = tmp_path / "policy.toml"
    assert main(["init", "--from", str(data), "--privacy-unit", "pid", "-o", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text()
    columns = load_policy(out).dataset("pums_dup").tables["pums_dup"].columns
    assert set(columns) == {"age", "sex", "educ", "race", "income", "married", "pid"}
    assert {c.type for c in columns.values()} == {"str"}  # a CSV: the owner chooses
    assert all(c.lower is None and c.public_values is None for c in columns.values())
    numbers = set(re.findall(r"\d+", text))
    values = duckdb.sql(f"SELECT DISTINCT income::VARCHAR FROM '{data}' WHERE income >= 100")
    assert not numbers & {v for (v,) in values.fetchall()}
    assert len(unfilled(text)) == len(untyped(text)) == 7  # every column's type


def test_init_takes_no_type_from_a_csvs_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One person's 41.5 would make ``age`` a float in a policy every user reads,
    and their date or true/false would type the other columns: a CSV's column
    types are the owner's to choose, each a placeholder ``serve`` refuses, while
    a Parquet file's declared types are used."""
    rows = [f"{i},{30 + i % 50},2020-01-{1 + i % 28:02d},{i % 2 == 0}" for i in range(200)]
    rows[117] = "117,41.5,2020-03-01,false"  # the one person
    data = tmp_path / "people.csv"
    data.write_text("pid,age,joined,member\n" + "\n".join(rows) + "\n")
    sniffed = duckdb.sql(f"DESCRIBE SELECT * FROM read_csv_auto('{data}')").fetchall()
    assert [t for _, t, *_ in sniffed] == ["BIGINT", "DOUBLE", "DATE", "BOOLEAN"]
    out = tmp_path / "policy.toml"
    assert main(["init", "--from", str(data), "--privacy-unit", "pid", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    text = out.read_text()
    columns = load_policy(out).dataset("people").tables["people"].columns
    assert {name: c.type for name, c in columns.items()} == dict.fromkeys(columns, "str")
    assert untyped(text) == ["people.pid", "people.age", "people.joined", "people.member"]
    assert (
        'column(s) are written "str" until you choose each type: people.pid, people.age, ' in said
    )
    assert "41.5" not in text and "41" not in re.findall(r"\d+", text)
    # A declared schema is the owner's choice already: Parquet keeps its types.
    parquet = tmp_path / "people.parquet"
    duckdb.sql(f"COPY (SELECT * FROM read_csv_auto('{data}')) TO '{parquet}' (FORMAT parquet)")
    typed = tmp_path / "typed.toml"
    assert main(["init", "--from", str(parquet), "--privacy-unit", "pid", "-o", str(typed)]) == 0
    assert "declares no column types" not in capsys.readouterr().out
    columns = load_policy(typed).dataset("people").tables["people"].columns
    assert [c.type for c in columns.values()] == ["int", "float", "date", "bool"]
    assert untyped(typed.read_text()) == []


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


def test_transcript_export_is_readable_by_its_writer_only(
    spent_gate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transcript holds a user's queries and released answers: 0600 whatever the
    umask, and a file it replaces becomes 0600 before the answers are in it."""
    me = pwd.getpwuid(os.getuid()).pw_name
    there = tmp_path / "there.json"
    there.write_text("an older export")
    there.chmod(0o644)
    umask = os.umask(0o022)
    try:
        for out in (tmp_path / "new.json", there):
            args = ["transcript", "export", "--policy", str(spent_gate), "--user", me]
            assert main([*args, "--notebook", "a.ipynb", "-o", str(out)]) == 0
            assert f"wrote {out}: 1 answers" in capsys.readouterr().out
            assert out.stat().st_mode & 0o777 == 0o600
            assert json.loads(out.read_text())["user"] == me
    finally:
        os.umask(umask)


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


def test_console_public_urls_reach_the_host_check(tmp_path: Path, monkeypatch) -> None:
    """``--public-url`` (repeatable) is what the console answers besides its own address:
    the command passes every one to ``serve.run``'s ``public``, and none without it."""
    from dpmagic.gate.console import serve

    policy = prepare_example(tmp_path, patients=20)
    seen: list[list[str]] = []
    monkeypatch.setattr(serve, "run", lambda *a, public=(), **k: seen.append(list(public)) or 0)
    urls = ["https://console.example.org", "https://owner.example.org:8443"]
    args = ["console", "--policy", str(policy)]
    assert main([*args, "--public-url", urls[0], "--public-url", urls[1]]) == 0
    assert main(args) == 0
    assert seen == [urls, []]
