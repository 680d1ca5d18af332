"""The bundled clinic: deterministic, realistic, and inside its own policy."""

from __future__ import annotations

import inspect
from pathlib import Path

import duckdb
import nbformat
import pytest

from dpmagic.commands.demo import example_file
from dpmagic.examples import clinic
from dpmagic.gate.policy import load_policy
from dpmagic.kernel import install, kernel_json

PATIENTS = 400


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("clinic")
    clinic.generate(out, patients=PATIENTS)
    (out / "clinic.toml").write_text(example_file("clinic.toml").read_text())
    return out


def _rows(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect()
    try:
        return con.execute(sql.replace("{t}", f"read_csv_auto('{path}')")).fetchall()
    finally:
        con.close()


def test_same_seed_same_bytes(tmp_path: Path, data: Path) -> None:
    again = clinic.generate(tmp_path, patients=PATIENTS)
    for name, path in again.items():
        assert path.read_bytes() == (data / f"{name}.csv").read_bytes()


def test_other_seed_other_data(tmp_path: Path, data: Path) -> None:
    other = clinic.generate(tmp_path, patients=PATIENTS, seed=8)
    assert other["visits"].read_bytes() != (data / "visits.csv").read_bytes()


def test_parquet_holds_the_same_rows(tmp_path: Path, data: Path) -> None:
    files = clinic.generate(tmp_path, patients=PATIENTS, fmt="parquet")
    con = duckdb.connect()
    try:
        for name, path in files.items():
            assert path.suffix == ".parquet"
            pq = con.execute("SELECT * FROM read_parquet(?)", [str(path)]).fetchall()
            csv = con.execute("SELECT * FROM read_csv_auto(?)", [str(data / f"{name}.csv")])
            assert pq == csv.fetchall()
    finally:
        con.close()


def test_shapes(data: Path) -> None:
    patients = data / "patients.csv"
    visits = data / "visits.csv"
    assert _rows(patients, "SELECT count(*), count(DISTINCT patient_id) FROM {t}") == [
        (PATIENTS, PATIENTS)
    ]
    ((n_visits, n_patients, fewest, most),) = _rows(
        visits,
        "SELECT sum(n), count(*), min(n), max(n) FROM "
        "(SELECT patient_id, count(*) AS n FROM {t} GROUP BY patient_id)",
    )
    assert n_patients == PATIENTS  # every patient has at least one visit
    assert fewest >= 1 and most <= clinic.MAX_VISITS
    assert 2 * PATIENTS < n_visits < 5 * PATIENTS
    # Patient attributes repeated on visits agree with the patients table.
    mismatched = _rows(
        visits,
        f"SELECT count(*) FROM {{t}} v JOIN read_csv_auto('{patients}') p USING (patient_id) "
        "WHERE v.sex <> p.sex OR v.state <> p.state OR v.age > p.age",
    )
    assert mismatched == [(0,)]


def test_realistic_relations(data: Path) -> None:
    visits = data / "visits.csv"
    pregnancy = _rows(
        visits, "SELECT count(*) FROM {t} WHERE diagnosis = 'pregnancy' AND (sex = 'M' OR age < 18)"
    )
    assert pregnancy == [(0,)]
    ((old, young),) = _rows(
        visits,
        "SELECT avg(cost) FILTER (WHERE age >= 65), avg(cost) FILTER (WHERE age < 35) FROM {t}",
    )
    assert old > young
    pediatric = _rows(
        visits, "SELECT count(*) FROM {t} WHERE department = 'pediatrics' AND age >= 18"
    )
    assert pediatric == [(0,)]


def test_values_inside_the_policy(data: Path) -> None:
    policy = load_policy(data / "clinic.toml")
    dataset = policy.dataset("clinic")
    assert dataset.privacy_unit == "patient_id"
    assert set(dataset.sources) == {"patients", "visits"}
    for table_name, source in dataset.sources.items():
        assert source.exists()
        table = dataset.table(table_name)
        assert table is not None
        described = _rows(source, "DESCRIBE SELECT * FROM {t}")
        assert {row[0] for row in described} == set(table.columns), table_name
        for column in table.columns.values():
            if column.public_values is not None:
                seen = {v for (v,) in _rows(source, f"SELECT DISTINCT {column.name} FROM {{t}}")}
                assert seen <= set(column.public_values), (table_name, column.name)
            if column.bounded:
                ((lo, hi, nulls),) = _rows(
                    source,
                    f"SELECT min({column.name}), max({column.name}), "
                    f"count(*) - count({column.name}) FROM {{t}}",
                )
                assert column.lower <= lo and hi <= column.upper, (table_name, column.name)
                assert nulls == 0


def test_policy_declares_every_generated_category() -> None:
    visits = load_policy(example_file("clinic.toml")).dataset(None).table("visits")
    assert visits is not None
    assert visits.columns["diagnosis"].public_values == clinic.DIAGNOSIS_NAMES
    assert visits.columns["department"].public_values == clinic.DEPARTMENTS
    assert visits.columns["state"].public_values == clinic.STATES
    assert visits.columns["age_band"].public_values == clinic.AGE_BANDS
    assert visits.columns["year"].public_values == clinic.YEARS


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert clinic.main([str(tmp_path), "--patients", "20"]) == 0
    assert "visits:" in capsys.readouterr().out
    assert _rows(tmp_path / "patients.csv", "SELECT count(*) FROM {t}") == [(20,)]
    # The policy beside the data, ready to serve.
    assert load_policy(tmp_path / "clinic.toml").dataset("clinic").tables["visits"]
    parquet = tmp_path / "parquet"
    assert clinic.main([str(parquet), "--patients", "20", "--format", "parquet"]) == 0
    sources = load_policy(parquet / "clinic.toml").dataset("clinic").sources
    assert {p.name for p in sources.values()} == {"patients.parquet", "visits.parquet"}


def test_quickstart_notebook_is_valid() -> None:
    nb = nbformat.read(example_file("quickstart.ipynb"), as_version=4)
    nbformat.validate(nb)
    # It opens on the gated kernel (kernel.install's name), and runs on any Python one.
    assert nb.metadata.kernelspec.name == inspect.signature(install).parameters["name"].default
    assert nb.metadata.kernelspec.display_name == kernel_json()["display_name"]
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    assert sources[0] == "%load_ext dpmagic"
    assert sum(s.startswith("%%dpsql") for s in sources) >= 5
    assert sources[-1] == "%dpbudget"
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")


def test_the_quickstart_leaves_most_of_its_notebook_budget() -> None:
    """It spent ε 2.9 of the notebook's 3, so a newcomer's first cell of their own was
    refused: now at most half, read from its cells and the example's policy."""
    dataset = load_policy(example_file("clinic.toml")).dataset("clinic")
    nb = nbformat.read(example_file("quickstart.ipynb"), as_version=4)
    spent = 0.0
    for cell in nb.cells:
        first = cell.source.split("\n", 1)[0].split()
        if cell.cell_type != "code" or first[:1] != ["%%dpsql"]:
            continue
        if {"--dry-run", "--mock", "--save"} & set(first):
            continue
        asked = float(first[first.index("-e") + 1]) if "-e" in first else None
        spent += dataset.query_default.epsilon if asked is None else asked
    assert spent <= dataset.notebook_budget.epsilon / 2
    assert spent == pytest.approx(1.4)
