"""The request path's small gate: 300 rows of ``(pid, age, sex)``, two per person,
under a policy with a notebook budget of 2 and a user budget of 3 (``POLICY``, with
the query timeout to fill in). ``write_policy`` writes it to a folder; shared by
tests/unit/test_engine.py, whose ``engine`` serves it, and by the accountants' and
accuracy-first tests, which write their own policy over its data."""

from __future__ import annotations

import textwrap

from tests.gate_helpers import write_gate

POLICY = """
[gate]
state_dir = "state"
query_timeout_s = {timeout}

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = {{ epsilon = 3.0 }}
notebook_budget = {{ epsilon = 2.0 }}
query_default = {{ epsilon = 0.5 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""


def people(rows: int) -> list[tuple[int, int, int]]:
    return [(i // 2, (i * 37) % 90, i % 2) for i in range(rows)]


def write_policy(path, rows: int = 300, timeout: float = 30.0):
    text = textwrap.dedent(POLICY.format(timeout=timeout))
    return write_gate(path, text, {"t": ("pid,age,sex", people(rows))})
