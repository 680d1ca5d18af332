"""The attacks' small dataset: 40 people in one DuckDB table ``t`` (pid, age, sick,
code), the target the attacks single out (pid 5), and ``write_people``, which writes
a database and its policy under a budget the test chooses. Shared by
tests/unit/test_attacks.py (differencing, averaging, reconstruction on engines) and
tests/system/test_attacks.py (no data-dependent errors, on real gates)."""

from __future__ import annotations

from pathlib import Path

import duckdb

PEOPLE = 40
TARGET = 5

POLICY = """
[gate]
state_dir = "state-{name}"
response_quantum_ms = 0  # padding off: many queries, timing is not what is tested

[datasets.d]
database = "{name}.duckdb"
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = {{ epsilon = {budget} }}
notebook_budget = {{ epsilon = {budget} }}
query_default = {{ epsilon = 0.1 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sick = {{ type = "int", lower = 0, upper = 1 }}
code = {{ type = "str" }}
"""


def write_people(folder: Path, name: str, rows: list[tuple], budget: float) -> Path:
    con = duckdb.connect(str(folder / f"{name}.duckdb"))
    con.execute("CREATE TABLE t (pid BIGINT, age BIGINT, sick BIGINT, code VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    con.close()
    policy = folder / f"{name}.toml"
    policy.write_text(POLICY.format(name=name, budget=budget))
    return policy
