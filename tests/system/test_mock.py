"""Mock runs: fake tables from the public schema, queried in the kernel's own DuckDB.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_mock.py."""

from __future__ import annotations

from dpmagic.client.http_gate import Gate
from dpmagic.client.mock import mock_query


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
