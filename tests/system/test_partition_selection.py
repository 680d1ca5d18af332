"""Private GROUP BY keys through DP partition selection.

The threshold's calibration is checked against OpenDP's own privacy map; the
noisy rule against the exact discrete Laplace tail (and OpenDP's measurement
against the same tail), with a mis-scaled variant caught; the counts it is
applied to, and every measurement over the kept keys, against brute force on
neighbouring datasets; and the whole path through the engine: refusals that
say what to change, rare keys never released, common ones always, a cost
that does not depend on the data, the dry run and the reply showing the
threshold and δ.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import opendp.prelude as dp
import pytest
from hypothesis import strategies as st

from dpmagic.client import Gate
from dpmagic.errors import QueryRefused
from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy
from tests.conftest import GateProcess

dp.enable_features("contrib")

# --- calibration against OpenDP's map --------------------------------------------


# --- the noisy rule, statistically ---------------------------------------------


COUNTS = [2, 5, 8, 10, 12, 15, 18]
DRAWS = 3000


# --- brute force on neighbouring datasets ----------------------------------------

COLUMNS = {
    "pid": {"type": "int"},
    "s": {"type": "str"},
    "g": {"type": "int", "public_values": [0, 1]},
    "x": {"type": "int", "lower": -3, "upper": 5},
}
ORDER = ["pid", "s", "g", "x"]
QUERIES = [
    "SELECT s, COUNT(*) FROM t GROUP BY s",
    "SELECT s, g, SUM(x), AVG(x) FROM t GROUP BY s, g",
    "SELECT s, COUNT(DISTINCT pid), COUNT(DISTINCT x) FROM t WHERE x > -2 GROUP BY s",
    "SELECT s, MEDIAN(x), VAR_POP(x) FROM t GROUP BY s",
    "SELECT COALESCE(s, 'none') AS k, COUNT(x) FROM t GROUP BY k",
]
row = st.tuples(
    st.sampled_from(["a", "b", "c", None]),
    st.sampled_from([0, 1, None]),
    st.one_of(st.none(), st.integers(-6, 8)),
)
unit_rows = st.lists(row, min_size=0, max_size=5)


SEMANTIC_QUERIES = [
    "SELECT s, COUNT(*), SUM(x) FROM t GROUP BY s",
    "SELECT UPPER(s) || '-' || g AS k, COUNT(x), SUM(x) FROM t WHERE LENGTH(s) >= 1 GROUP BY k",
    "SELECT s, g, COUNT(*) FILTER (WHERE x > 0) FROM t WHERE g = 1 OR x < 0 GROUP BY s, g",
]


# --- through the engine ----------------------------------------------------------

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
city = {{ type = "str" }}
age = {{ type = "int", lower = 0, upper = 100 }}
"""


def _engine(folder: Path, rows: list[tuple[int, str, int]], accountant="approx", delta=1e-6):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["pid,city,age"] + [f"{p},{c},{a}" for p, c, a in rows]
    (folder / "t.csv").write_text("\n".join(lines) + "\n")
    text = POLICY.format(accountant=accountant, delta=delta)
    (folder / "policy.toml").write_text(textwrap.dedent(text))
    return Engine(load_policy(folder / "policy.toml"))


def _city_rows(rare: str | None) -> list[tuple[int, str, int]]:
    rows = [(p, "Springfield" if p % 2 else "Shelbyville", 20 + p % 50) for p in range(1, 1201)]
    if rare is not None:
        rows.append((5000, rare, 40))  # one person alone in their city
    return rows


def test_private_keys_through_a_real_gate_and_client(tmp_path, short_dir):
    """Over the unix socket: keys chosen, the rare city absent, a refusal without δ."""
    folder = tmp_path / "g"
    _engine(folder, _city_rows("Ogdenville"), delta=0.0).close()
    process = GateProcess(folder / "policy.toml", f"unix:{short_dir / 'gate.sock'}")
    process.start()
    try:
        client = Gate(process.address)
        sql = "SELECT city, COUNT(*) AS n FROM t GROUP BY city ORDER BY city"
        result = client.query(sql, epsilon=1.0, delta=1e-6)
        assert list(result.df["city"]) == ["Shelbyville", "Springfield"]
        assert result.cost == {"epsilon": 1.0, "delta": 1e-6}
        assert "kept where noisy units ≥" in result.footer()
        with pytest.raises(QueryRefused, match="ask with a δ > 0"):
            client.query(sql, epsilon=1.0)
    finally:
        process.stop()
