"""Spark's prepared location on the gate's disk, without Spark: a folder of the
gate's user that no one else may enter, its files ``0600`` and folders ``0700``.

Before, the location was used as it was found (or made by Spark, ``0755``), and
Spark wrote the prepared tables, a copy of the private data, ``0644``/``0755``.
What Spark itself writes there is checked in ``tests/system/test_spark.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpmagic.gate.engines.spark import prepare
from dpmagic.gate.engines.spark.prepare import prepared_tables, private_root, restrict
from dpmagic.gate.policy import PolicyError, parse_policy


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_missing_location_is_created_for_the_gate_alone(tmp_path: Path, umask_022) -> None:
    root = tmp_path / "cluster" / "prepared"
    private_root(root)
    assert root.is_dir() and _mode(root) == 0o700
    private_root(root)  # and accepted as it now is


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o705, 0o770, 0o707, 0o711, 0o777])
def test_a_location_open_to_others_is_refused_by_name(tmp_path: Path, mode: int) -> None:
    root = tmp_path / "prepared"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(PolicyError) as refused:
        private_root(root)
    message = str(refused.value)
    assert f"Spark's prepared location {root} is open to others (mode {mode:04o})" in message
    assert f"chmod 700 {root}" in message
    assert _mode(root) == mode  # left as the owner set it: they decide


def test_a_location_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "prepared"
    root.mkdir(mode=0o700)
    root.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(root, 65534, 65534)  # nobody's
    else:  # the gate seen as another user than the folder's
        uid = os.geteuid()
        monkeypatch.setattr(prepare.os, "geteuid", lambda: uid + 1)
    with pytest.raises(PolicyError, match=f"{root} belongs to uid \\d+, not to the gate's user"):
        private_root(root)


def test_a_file_is_not_a_location(tmp_path: Path) -> None:
    root = tmp_path / "prepared"
    root.write_text("")
    with pytest.raises(PolicyError, match="is not a folder"):
        private_root(root)


def test_restrict_makes_files_0600_and_folders_0700(tmp_path: Path, umask_022) -> None:
    """The layout Spark writes: a version folder, a folder per table, part files,
    their checksums and ``_SUCCESS``, all with the umask's modes."""
    version = tmp_path / "v.0123456789abcdef01234567"
    table = version / "visits"
    table.mkdir(parents=True)
    files = [table / "part-00000.snappy.parquet", table / ".part-00000.crc", table / "_SUCCESS"]
    for f in files:
        f.write_bytes(b"x")
    (version / "_dpmagic_complete").mkdir()
    assert _mode(table) == 0o755 and _mode(files[0]) == 0o644
    restrict(version)
    for folder in (version, table, version / "_dpmagic_complete"):
        assert _mode(folder) == 0o700, folder
    for f in files:
        assert _mode(f) == 0o600, f


def _spark_policy(tmp_path: Path, prepared: str) -> dict:
    (tmp_path / "t.parquet").write_bytes(b"")
    return {
        "gate": {"state_dir": str(tmp_path / "state")},
        "datasets": {
            "d": {
                "sources": {"t": "t.parquet"},
                "privacy_unit": "pid",
                "user_budget": {"epsilon": 1.0},
                "engine": "spark",
                "spark": {"master": "local[1]", "prepared": prepared},
                "tables": {"t": {"columns": {"pid": {"type": "int"}}}},
            }
        },
    }


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_the_gate_refuses_an_open_location_before_spark_writes_there(
    tmp_path: Path, scheme: str
) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o755)
    policy = parse_policy(_spark_policy(tmp_path, f"{scheme}{root}"), tmp_path / "p.toml")
    dataset = policy.dataset("d")
    assert dataset.spark is not None
    # No Spark session: the refusal comes before any use of it.
    with pytest.raises(PolicyError, match=f"{root} is open to others"):
        prepared_tables(None, dataset, dataset.spark.prepared)  # type: ignore[arg-type]
    assert list(root.iterdir()) == []
