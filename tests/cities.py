"""A gate whose private GROUP BY key is a city: ``cities_engine`` writes rows of
``(pid, city, age)`` and a policy (the accountant and the query's default δ to
choose) and serves them; ``city_rows`` gives 1,200 people in two common cities and,
if asked, one person alone in a rare one. Shared by the partition-selection tests in
tests/unit/ (on engines) and tests/system/ (through a real gate and client)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy

POLICY = """
[gate]
state_dir = "state"
accountant = "{accountant}"
response_quantum_ms = 0

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = 50.0, delta = 1e-3 }}
notebook_budget = {{ epsilon = 50.0, delta = 1e-3 }}
query_default = {{ epsilon = 1.0, delta = {delta} }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
city = {{ type = "str", max_length = 64 }}
age = {{ type = "int", lower = 0, upper = 100 }}
"""


def cities_engine(folder: Path, rows: list[tuple[int, str, int]], accountant="approx", delta=1e-6):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["pid,city,age"] + [f"{p},{c},{a}" for p, c, a in rows]
    (folder / "t.csv").write_text("\n".join(lines) + "\n")
    text = POLICY.format(accountant=accountant, delta=delta)
    (folder / "policy.toml").write_text(textwrap.dedent(text))
    return Engine(load_policy(folder / "policy.toml"))


def city_rows(rare: str | None) -> list[tuple[int, str, int]]:
    rows = [(p, "Springfield" if p % 2 else "Shelbyville", 20 + p % 50) for p in range(1, 1201)]
    if rare is not None:
        rows.append((5000, rare, 40))  # one person alone in their city
    return rows
