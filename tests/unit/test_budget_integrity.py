"""Budget integrity against a real gate process: racing clients (threads and
processes) never overspend, ``kill -9`` between the debit and the reply leaves
the debit recorded and the ledger readable, the ledger and audit log survive
restarts, and what a query costs never depends on the data.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError
from dpmagic.gate.policy import load_policy

# -- cost never depends on the data ----------------------------------------------

NEIGHBOUR_POLICY = """
[gate]
state_dir = "state-{name}"
response_quantum_ms = 0

[datasets.d]
database = "{name}.duckdb"
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = 3.0 }}
notebook_budget = {{ epsilon = 2.0 }}
query_default = {{ epsilon = 0.25 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""
QUERIES = [
    ("SELECT COUNT(*) FROM t", None),
    ("SELECT sex, COUNT(*), AVG(age) FROM t GROUP BY sex", 0.5),
    ("SELECT SUM(age) FROM t WHERE age > 90", None),
    ("SELECT MEDIAN(age) FROM t", 0.3),
    ("SELECT COUNT(*) FROM t WHERE age / (age - 99) > 1", None),
    ("SELECT * FROM t", None),  # refused
    ("SELECT SUM(age * age * age * age * age * age * age * age * age * age) FROM t", None),
    ("SELECT COUNT(*) FROM t", 1.0),  # more than the notebook has left: refused for budget
    ("SELECT COUNT(*) FROM t", None),  # a replay
]


def _engine(folder: Path, name: str, rows: list[tuple[int, int, int]]) -> Engine:
    con = duckdb.connect(str(folder / f"{name}.duckdb"))
    con.execute("CREATE TABLE t (pid BIGINT, age BIGINT, sex BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.close()
    (folder / f"{name}.toml").write_text(NEIGHBOUR_POLICY.format(name=name))
    return Engine(load_policy(folder / f"{name}.toml"))


def _trace(engine: Engine) -> list[object]:
    """Everything about each reply that must not depend on the data."""
    out: list[object] = []
    for sql, epsilon in QUERIES:
        body = {"sql": sql, "notebook": "nb", **({"epsilon": epsilon} if epsilon else {})}
        try:
            r = engine.query("alice", body)
        except GateError as exc:
            out.append((exc.kind, exc.message))
            continue
        out.append((r["cost"], r["budget"], r["plan"], r["columns"], len(r["rows"]), r["replayed"]))
    return out


def test_cost_and_budget_never_depend_on_the_data(tmp_path):
    base = [(i, (i * 37) % 90, i % 2) for i in range(100)]
    target = [(999, 99, 1), (999, 99, 1)]  # the unit whose presence is secret; age 99
    with_it = _engine(tmp_path, "with", base + target)
    without = _engine(tmp_path, "without", base)
    try:
        a, b = _trace(with_it), _trace(without)
    finally:
        with_it.close()
        without.close()
    assert a == b
    kinds = [t[0] for t in a if isinstance(t[0], str)]
    assert kinds == ["refused", "refused", "budget"]
