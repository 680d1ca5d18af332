"""The prepared copy of a dataset is made once and reused across restarts
(``dpmagic/gate/engines/duckdb/prepared.py``), and made anew when its sources or the
policy facts it depends on change, the stale copy deleted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpmagic.gate.engines.duckdb.database import Database
from dpmagic.gate.engines.duckdb.prepared import prepared_file
from dpmagic.gate.policy import Policy, parse_policy

ROWS = "pid,age,city\n" + "".join(f"{i % 7},{i % 90},c{i % 3}\n" for i in range(60))


def _policy(folder: Path, upper: int = 100, max_rows: int = 2) -> Policy:
    raw = {
        "gate": {"state_dir": "state"},
        "datasets": {
            "d": {
                "sources": {"t": "t.csv"},
                "privacy_unit": "pid",
                "max_rows_per_partition": max_rows,
                "user_budget": {"epsilon": 1.0},
                "tables": {
                    "t": {
                        "columns": {
                            "pid": {"type": "int"},
                            "age": {"type": "int", "lower": 0, "upper": upper},
                            "city": {"type": "str"},
                        }
                    }
                },
            }
        },
    }
    return parse_policy(raw, folder / "policy.toml")


def _ranked(policy: Policy) -> list[tuple]:
    db = Database(policy.dataset("d"), policy.gate)
    try:
        return db._db.execute(
            'SELECT pid, age, city, "__dpmagic_rank" FROM t ORDER BY ALL'
        ).fetchall()
    finally:
        db.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "t.csv").write_text(ROWS)
    return tmp_path


def test_a_restart_reuses_the_prepared_file_and_its_ranks(folder):
    policy = _policy(folder)
    first = _ranked(policy)
    (made,) = policy.gate.state_dir.glob("d.*.duckdb")
    stamp = made.stat().st_mtime_ns
    assert _ranked(policy) == first  # the same rows and ranks: the same secret seed
    assert made.stat().st_mtime_ns == stamp and made.exists()
    assert list(policy.gate.state_dir.glob("d.*.duckdb")) == [made]


@pytest.mark.parametrize(
    "change",
    ["source rewritten", "a bound changed", "the contribution bound changed"],
)
def test_a_change_prepares_anew_and_deletes_the_stale_copy(folder, change):
    policy = _policy(folder)
    _ranked(policy)
    (old,) = policy.gate.state_dir.glob("d.*.duckdb")
    if change == "source rewritten":
        (folder / "t.csv").write_text(ROWS + "99,5,c0\n")
        os.utime(folder / "t.csv", ns=(1, 1))
    elif change == "a bound changed":
        policy = _policy(folder, upper=50)
    else:
        policy = _policy(folder, max_rows=1)
    rows = _ranked(policy)
    (new,) = policy.gate.state_dir.glob("d.*.duckdb")
    assert new != old and not old.exists()
    if change == "source rewritten":
        assert any(r[0] == 99 for r in rows)
    if change == "a bound changed":
        assert max(r[1] for r in rows) == 50


def test_an_interrupted_preparation_is_never_reused(folder):
    policy = _policy(folder)
    ds = policy.dataset("d")
    target = prepared_file(ds, policy.gate.state_dir)
    target.unlink()
    # What a crash halfway leaves: a partial file under another name, never the target.
    target.with_suffix(".loading").write_bytes(b"partial")
    assert prepared_file(ds, policy.gate.state_dir) == target
    assert _ranked(policy)
    assert not target.with_suffix(".loading").exists()
