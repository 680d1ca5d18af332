"""Mock runs: fake tables from the public schema, queried in the kernel's own DuckDB."""

from __future__ import annotations

from dpmagic.client import Gate
from dpmagic.mock import mock_query

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


def test_mock_runs_through_a_gate_never_send_the_query(gate):
    """The gate sees only GET /v1/schema: a query it would refuse runs, nothing is charged,
    and the answer is what the schema alone gives."""
    client = Gate(gate.address)
    before = client.budget(notebook="nb")
    result = client.query("SELECT * FROM t WHERE age > 50", mock=True, mock_rows=50)
    assert result.mock and len(result.rows) > 0 and result.columns == ["pid", "age", "sex"]
    assert client.budget(notebook="nb") == before
    assert client.history(notebook="nb")["entries"] == []
    offline = mock_query("SELECT * FROM t WHERE age > 50", client.schema(), None, 50)
    assert offline.rows == result.rows
