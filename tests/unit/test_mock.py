"""Mock runs: fake tables from the public schema, queried in the kernel's own DuckDB."""

from __future__ import annotations

import pytest

from dpmagic.client.errors import DPError
from dpmagic.client.mock import mock_query, mock_tables

SCHEMA = {
    "dataset": "clinic",
    "privacy_unit": "patient_id",
    "max_rows_per_partition": 4,
    "tables": {
        "patients": {
            "public": False,
            "unit": "patient_id",
            "columns": {
                "patient_id": {"type": "int"},
                "age": {"type": "int", "lower": 0, "upper": 100},
                "sex": {"type": "str", "public_values": ["F", "M"]},
                "smoker": {"type": "int", "public_values": [0, 1],
                           "randomized_response": {"p": 0.75}},
                "note": {"type": "str"},
            },
        },
        "visits": {
            "public": False,
            "unit": "patient_id",
            "links": {"patient_id": "patients.patient_id"},
            "columns": {
                "patient_id": {"type": "int"},
                "cost": {"type": "float", "lower": 0.0, "upper": 50000.0},
                "day": {"type": "date", "lower": "2019-01-01", "upper": "2024-12-31"},
                "urgent": {"type": "bool"},
            },
        },
        "regions": {"public": True, "columns": {"state": {"type": "str",
                                                          "public_values": ["CA", "TX"]}}},
    },
}  # fmt: skip


def test_mock_tables_stay_within_the_declared_bounds_and_values():
    tables = mock_tables(SCHEMA, units=300)
    patients, visits = tables["patients"], tables["visits"]
    assert len(patients) == 300 and patients["patient_id"].is_unique
    assert patients["age"].between(0, 100).all()
    assert set(patients["sex"]) == {"F", "M"} and set(patients["smoker"]) <= {0, 1}
    # each patient has 1 to max_rows_per_partition visits, all of known patients
    per_patient = visits.groupby("patient_id").size()
    assert per_patient.between(1, 4).all() and len(per_patient) == 300
    assert visits["cost"].between(0, 50000).all()
    assert visits["day"].min().isoformat() >= "2019-01-01"
    assert visits["day"].max().isoformat() <= "2024-12-31"
    assert set(tables["regions"]["state"]) == {"CA", "TX"}


def test_a_mock_run_is_labelled_and_free():
    result = mock_query(
        "SELECT sex, COUNT(*) AS n, AVG(age) AS mean_age FROM patients GROUP BY sex ORDER BY sex",
        SCHEMA,
    )
    assert result.mock and result.columns == ["sex", "n", "mean_age"]
    assert [r[0] for r in result.rows] == ["F", "M"]
    assert sum(r[1] for r in result.rows) == 1000  # the default number of units
    assert result.cost["epsilon"] == 0
    for view in (repr(result), result._repr_html_(), result._repr_markdown_()):
        assert view.count("mock data — not the real dataset") >= 2  # banner and footer
    assert result.budget_note() is None  # the status bar keeps the gate's figure


def test_a_mock_run_binds_parameters_and_reports_sql_errors():
    result = mock_query("SELECT COUNT(*) AS n FROM patients WHERE age >= $lo", SCHEMA, {"lo": 200})
    assert result.rows == [[0]]
    with pytest.raises(DPError, match=r"on mock data — not the real dataset: .*nope"):
        mock_query("SELECT nope FROM patients", SCHEMA)


def test_the_mock_database_reads_no_files(tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(DPError, match="on mock data"):
        mock_query(f"SELECT COUNT(*) FROM read_csv('{secret}')", SCHEMA)
