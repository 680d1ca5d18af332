"""Private GROUP BY keys through DP partition selection.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_partition_selection.py, the city gate both use in tests/cities.py."""

from __future__ import annotations

import opendp.prelude as dp
import pytest

from dpmagic.client.errors import QueryRefused
from dpmagic.client.http_gate import Gate
from tests.cities import cities_engine, city_rows
from tests.conftest import GateProcess

dp.enable_features("contrib")

# --- calibration against OpenDP's map --------------------------------------------


# --- the noisy rule, statistically ---------------------------------------------


# --- brute force on neighbouring datasets ----------------------------------------


# --- through the engine ----------------------------------------------------------


def test_private_keys_through_a_real_gate_and_client(tmp_path, short_dir):
    """Over the unix socket: keys chosen, the rare city absent, a refusal without δ."""
    folder = tmp_path / "g"
    cities_engine(folder, city_rows("Ogdenville"), delta=0.0).close()
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
