"""The import contracts of ``pyproject.toml`` (``lint-imports`` runs them in CI): the
notebook's side lists every top-level module but the commands, so a new module is
classified when it is added; and a module of the notebook's side that imports the
gate is caught by ``lint-imports``, run on a copy of the package with one such
import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
# Commands that start, supervise or set up a gate: they may import it.
COMMANDS = {"__init__", "__main__", "cli", "demo", "init_policy", "lab", "supervisor"}


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def test_the_notebooks_side_lists_every_module_but_the_commands():
    (client,) = [c for c in _contracts() if c["forbidden_modules"] == ["dpmagic.gate"]]
    modules = {p.stem for p in (ROOT / "dpmagic").glob("*.py")}
    assert {m.removeprefix("dpmagic.") for m in client["source_modules"]} == modules - COMMANDS


def _lint(folder: Path) -> subprocess.CompletedProcess[str]:
    linter = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(linter), "--config", str(folder / "pyproject.toml")],
        cwd=folder,
        env={"PYTHONPATH": str(folder), "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_client_module_importing_the_gate_is_caught(tmp_path):
    shutil.copytree(ROOT / "dpmagic", tmp_path / "dpmagic", ignore=shutil.ignore_patterns(
        "__pycache__", "labextension", "examples"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _lint(tmp_path).returncode == 0
    render = tmp_path / "dpmagic" / "render.py"
    render.write_text(render.read_text() + "\nimport dpmagic.gate.engine  # noqa\n")
    broken = _lint(tmp_path)
    assert broken.returncode != 0
    assert "dpmagic.render -> dpmagic.gate.engine" in broken.stdout
