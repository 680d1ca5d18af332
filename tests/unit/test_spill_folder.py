"""Where a query spills past the memory limit: a folder of the gate's own in its
state directory, readable by the gate's user only, removed at close. DuckDB's default
is ``.tmp`` in the working directory, where spilled private rows would be open to
others and outlive a killed gate (found running TPC-H at SF 1)."""

from __future__ import annotations

from pathlib import Path

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy
from tests import shop


def test_queries_spill_into_a_private_folder_of_the_state_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    shop.build(tmp_path / "shop.duckdb", customers=5)
    (tmp_path / "p.toml").write_text(shop.policy_text(tmp_path / "shop.duckdb", tmp_path / "s"))
    engine = Engine(load_policy(tmp_path / "p.toml"))
    store = engine.databases["shop"]
    ((where,),) = store._db.execute("SELECT current_setting('temp_directory')").fetchall()
    spill = Path(where)
    assert spill.parent == (tmp_path / "s").resolve() or spill.parent == tmp_path / "s"
    assert spill.is_dir() and spill.stat().st_mode & 0o777 == 0o700
    engine.query("ann", {"sql": "SELECT COUNT(*) FROM orders", "epsilon": 1.0})
    engine.close()
    assert not spill.exists()
    assert not (tmp_path / ".tmp").exists()
