"""Joins on the bundled clinic through the gate's request path: patients and
their visits, answered close to the truth when ε is large, refused with
nothing charged when a join could mix patients."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from dpmagic.commands.demo import example_file
from dpmagic.display.schema import SchemaView
from dpmagic.examples import clinic
from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError
from dpmagic.gate.policy import load_policy

PATIENTS = 300
EPSILON = 200.0  # little noise: answers land near the truth


@pytest.fixture(scope="module")
def clinic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("clinic")
    clinic.generate(out, patients=PATIENTS)
    text = example_file("clinic.toml").read_text()
    for key, value in (("user_budget", "10.0"), ("notebook_budget", "3.0")):
        text = text.replace(f"{key} = {{ epsilon = {value} }}", f"{key} = {{ epsilon = 1e6 }}")
    (out / "clinic.toml").write_text(text)
    return out


@pytest.fixture(scope="module")
def engine(clinic_dir: Path):
    e = Engine(load_policy(clinic_dir / "clinic.toml"))
    yield e
    e.close()


def _truth(clinic_dir: Path, sql: str) -> list[tuple]:
    con = duckdb.connect()
    for name in ("patients", "visits"):
        path = (clinic_dir / f"{name}.csv").as_posix().replace("'", "''")
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_csv_auto('{path}')")
    return con.execute(sql).fetchall()


def _ask(engine: Engine, sql: str) -> dict:
    return engine.query("alice", {"sql": sql, "epsilon": EPSILON, "fresh": True})


def test_a_join_on_the_patient_answers_near_the_truth(engine, clinic_dir):
    sql = (
        "SELECT p.insurance, COUNT(*) AS visits, AVG(v.stay_days) AS stay "
        "FROM visits AS v JOIN patients AS p ON v.patient_id = p.patient_id "
        "GROUP BY p.insurance ORDER BY p.insurance"
    )
    reply = _ask(engine, sql)
    truth = {k: (n, s) for k, n, s in _truth(clinic_dir, sql)}
    assert [r[0] for r in reply["rows"]] == sorted(truth)
    for insurance, visits, stay in reply["rows"]:
        n, s = truth[insurance]
        # At most 4 visits per patient are kept (max_rows_per_partition): counts can
        # only fall short of the truth, and by no more than the heavy visitors' extra.
        assert visits <= n + 5 and visits >= 0.6 * n
        assert stay == pytest.approx(s, abs=1.5)


def test_left_join_and_cte_with_a_median(engine, clinic_dir):
    sql = (
        "WITH adults AS (SELECT * FROM patients WHERE age >= 18) "
        "SELECT COUNT(DISTINCT a.patient_id) AS people, MEDIAN(a.age) AS median_age "
        "FROM adults AS a LEFT JOIN visits AS v ON a.patient_id = v.patient_id "
        "AND v.diagnosis = 'checkup'"
    )
    ((people, median_age),) = _ask(engine, sql)["rows"]
    ((true_people, true_median),) = _truth(clinic_dir, sql)
    assert people == pytest.approx(true_people, abs=3)
    assert abs(median_age - true_median) <= 5


def test_a_join_that_could_mix_patients_is_refused_free(engine):
    before = engine.budget("mallory", None, "x")["user"]["spent"]
    with pytest.raises(GateError) as info:
        engine.query(
            "mallory",
            {
                "sql": "SELECT COUNT(*) FROM visits AS a JOIN visits AS b "
                "ON a.department = b.department",
                "notebook": "x",
            },
        )
    assert info.value.kind == "refused" and "mix two units" in info.value.message
    assert engine.budget("mallory", None, "x")["user"]["spent"] == before


def test_the_policy_links_visits_to_patients():
    visits = load_policy(example_file("clinic.toml")).dataset(None).table("visits")
    assert visits is not None
    assert visits.links == {"patient_id": "patients.patient_id"}
    assert visits.unit == "patient_id"


def test_the_schema_names_each_tables_unit_links_and_bounds(engine):
    schema = engine.schema(None)
    tables = schema["tables"]
    assert tables["visits"]["unit"] == "patient_id"
    assert tables["visits"]["links"] == {"patient_id": "patients.patient_id"}
    assert tables["patients"]["unit"] == "patient_id" and "links" not in tables["patients"]
    assert tables["visits"]["public"] is False
    text = repr(SchemaView(schema))
    assert "links visits.patient_id → patients.patient_id" in text
    assert f"each unit in ≤ {schema['max_partitions']} groups" in text
    assert schema["engine"] == "duckdb" and "Spark" not in text
    assert "answered by Spark" in repr(SchemaView({**schema, "engine": "spark"}))
