"""Public tables read plainly, through a real gate process and the client: the
gate's typed ``exact`` facts as the user reads them (exact, nothing charged, the
row limit when it cut), and the budget unmoved."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from dpmagic.client.http_gate import Gate
from tests import shop
from tests.conftest import GateProcess

pytestmark = pytest.mark.system

PART = """
[datasets.shop.tables.part]
public = true
columns.p_partkey = { type = "int" }
columns.p_brand = { type = "str" }
"""


def test_a_public_read_is_exact_free_and_says_so(tmp_path: Path, short_dir: Path) -> None:
    shop.build(tmp_path / "shop.duckdb")
    text = shop.policy_text(tmp_path / "shop.duckdb", tmp_path / "state")
    text = text.replace("\n[datasets.shop.tables.part]\npublic = true\n", PART)
    text = text.replace(
        "max_rows_per_partition = 8",
        "max_rows_per_partition = 8\npublic_tables_readable = true\npublic_row_limit = 12",
    )
    (tmp_path / "policy.toml").write_text(text)
    gate = GateProcess(tmp_path / "policy.toml", f"unix:{short_dir / 'g.sock'}")
    gate.start()
    try:
        client = Gate(gate.address)
        sql = "SELECT p_brand, COUNT(*) AS parts FROM part GROUP BY p_brand ORDER BY p_brand"
        result = client.query(sql)
        con = duckdb.connect(str(tmp_path / "shop.duckdb"), read_only=True)
        assert [list(r) for r in result.rows] == [list(r) for r in con.execute(sql).fetchall()]
        assert result.footer().startswith(
            "exact: it reads only public tables, so nothing was charged · "
        )
        cut = client.query("SELECT p_partkey FROM part ORDER BY p_partkey")
        assert len(cut.rows) == 12
        assert cut.footer().startswith(
            "exact: it reads only public tables, so nothing was charged · the first 12 rows "
            "(the dataset's limit)"
        )
        spent = client.query("SELECT COUNT(*) FROM customer", epsilon=0.5).budget
        assert spent["user"]["spent"]["epsilon"] == pytest.approx(0.5)  # only this query
    finally:
        gate.stop()
