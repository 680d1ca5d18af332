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


def _policy(folder: Path, upper: int = 100, max_rows: int = 2, **gate: object) -> Policy:
    raw = {
        "gate": {"state_dir": "state", **gate},
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
    target = prepared_file(ds, policy.gate)
    target.unlink()
    # What a crash halfway leaves: a partial file under another name, never the target.
    target.with_suffix(".loading").write_bytes(b"partial")
    assert prepared_file(ds, policy.gate) == target
    assert _ranked(policy)
    assert not target.with_suffix(".loading").exists()


def test_the_preparation_holds_to_the_gates_memory_limit_and_cleans_its_spill_folder(
    folder, monkeypatch
):
    """The ranking runs on a connection with the policy's ``memory_limit`` and
    ``threads``, spilling into a folder of its own in the state directory that is gone
    after; whatever else the owner keeps there stays."""
    from dpmagic.gate.engines.duckdb import prepared

    policy = _policy(folder, memory_limit="123MB", threads=1)
    state = policy.gate.state_dir
    state.mkdir()
    (state / "notes.txt").write_text("the owner's")
    seen = {}
    original = prepared.prepare_tables

    def observed(con, dataset, relations, *args, **kwargs):
        settings = "memory_limit", "threads", "temp_directory"
        for name in settings:
            (seen[name],) = con.execute(f"SELECT current_setting('{name}')").fetchone()
        seen["spill exists"] = Path(seen["temp_directory"]).is_dir()
        return original(con, dataset, relations, *args, **kwargs)

    monkeypatch.setattr(prepared, "prepare_tables", observed)
    target = prepared_file(policy.dataset("d"), policy.gate)
    assert seen["memory_limit"] == "117.3 MiB"  # 123 MB, as DuckDB reports it
    assert seen["threads"] == 1
    spill = Path(seen["temp_directory"])
    assert spill.parent.resolve() == state.resolve()
    assert seen["spill exists"] and not spill.exists()
    assert sorted(p.name for p in state.iterdir()) == sorted([target.name, "notes.txt"])


def test_a_private_table_is_stored_in_rank_order(folder):
    """Each unit's rows, ranked at load, are stored rank by rank, so that a query's rank
    bound is decided by the row groups' zone maps rather than row by row (the reason
    is ``ranking.prepare_tables``'); as the window leaves them, they are stored by unit,
    ranks 1, 2, … of each in turn (the broken version, caught)."""
    db = Database(_policy(folder).dataset("d"), _policy(folder).gate)
    try:
        stored = [r for (r,) in db._db.execute('SELECT "__dpmagic_rank" FROM t').fetchall()]
    finally:
        db.close()
    assert len(stored) == 60 and stored[0] == 1 and stored[-1] > 1
    assert stored == sorted(stored)
