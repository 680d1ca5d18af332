"""Replies in columns through a real gate process: the Python client gets Arrow, other
clients JSON by asking for it, and both carry the same answer, integers beyond 64 bits
exact (docs/http-api.md, "Replies in columns")."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from dpmagic import wire
from dpmagic.client.http_gate import Gate
from tests.conftest import GateProcess
from tests.shells import COUNT_BY_SEX

# 100,000 units each adding 10**14: the exact sum, 10**19, is past 2**63.
UNITS, VALUE = 100_000, 10**14
BIG_POLICY = f"""
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.b]
database = "b.duckdb"
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = {{ epsilon = 50.0 }}
notebook_budget = {{ epsilon = 50.0 }}

[datasets.b.tables.t.columns]
pid = {{ type = "int" }}
x = {{ type = "int", lower = 0, upper = {VALUE} }}
"""


def _post(address: str, body: dict, accept: str | None) -> tuple[int, str, bytes]:
    """A raw HTTP request over the gate's unix socket, as a client in another language
    would send it."""
    conn = http.client.HTTPConnection("localhost", timeout=60)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address.removeprefix("unix:"))
    conn.sock = sock
    headers = {"Content-Type": "application/json"}
    if accept is not None:
        headers["Accept"] = accept
    try:
        conn.request("POST", "/v1/query", body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("accept", "arrow"),
    [
        (None, False),
        ("application/json", False),
        ("*/*", False),
        (wire.ARROW, True),
        (f"{wire.ARROW}, application/json;q=0.5", True),
        (f"{wire.ARROW};q=0.2, application/json", False),
        (f"{wire.ARROW};q=0", False),
    ],
)
def test_the_reply_is_arrow_only_for_a_client_that_prefers_it(gate, accept, arrow):
    body = {"sql": COUNT_BY_SEX, "epsilon": 0.5, "notebook": "negotiated"}
    status, kind, data = _post(gate.address, body, accept)
    assert status == 200
    assert kind == (wire.ARROW if arrow else wire.JSON)
    if arrow:
        table = pa.ipc.open_stream(data).read_all()  # any Arrow reader reads it
        assert table.column("sex").to_pylist() == [0, 1]
        envelope = json.loads(table.schema.metadata[wire.ENVELOPE])
        # The budget is this reply's, added after the answer was stored.
        assert envelope["budget"]["notebook"]["spent"]["epsilon"] == pytest.approx(0.5)
    else:
        assert [row[0] for row in json.loads(data)["rows"]] == [0, 1]


def test_an_error_is_json_whatever_was_asked(gate):
    status, kind, data = _post(gate.address, {"sql": "DELETE FROM t"}, wire.ARROW)
    assert status == 400 and kind == wire.JSON
    assert json.loads(data)["error"]["kind"] == "refused"


def test_the_client_reads_arrow_and_its_result_equals_the_json_replay(gate):
    result = Gate(gate.address).query(COUNT_BY_SEX, epsilon=0.5, notebook="nb")
    assert result._cells is not None  # it came as Arrow
    status, _, data = _post(gate.address, {"sql": COUNT_BY_SEX, "epsilon": 0.5,
                                           "notebook": "nb"}, None)  # fmt: skip
    replayed = json.loads(data)
    assert status == 200 and replayed["replayed"]
    assert replayed["rows"] == result.rows
    assert replayed["accuracy"]["columns"] == result.accuracy["columns"]


def test_a_sum_past_64_bits_is_exact_in_arrow_and_in_json(tmp_path: Path, short_dir: Path):
    con = duckdb.connect(str(tmp_path / "b.duckdb"))
    con.execute(f"CREATE TABLE t AS SELECT range AS pid, {VALUE}::BIGINT AS x FROM range({UNITS})")
    con.close()
    (tmp_path / "policy.toml").write_text(BIG_POLICY)
    process = GateProcess(tmp_path / "policy.toml", f"unix:{short_dir / 'gate.sock'}")
    process.start()
    try:
        sql = "SELECT SUM(x) AS s, COUNT(*) AS n FROM t"
        result = Gate(process.address).query(sql, epsilon=1.0)
        (total, count), *_ = result.rows
        assert isinstance(total, int) and total > 2**63  # 10**19 and noise of scale 10**14
        assert abs(total - UNITS * VALUE) < 10**17
        assert result.df["s"].tolist() == [total]
        _, _, data = _post(process.address, {"sql": sql, "epsilon": 1.0}, None)
        assert json.loads(data)["rows"] == [[total, count]]  # the replay, exactly
    finally:
        process.stop()
