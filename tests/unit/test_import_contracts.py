"""The import contracts of ``pyproject.toml`` (``lint-imports`` runs them in CI): the
notebook's side lists every top-level module but the commands, and the gate's layers
every package and module of ``gate/``, so a new module is classified when it is
added; and each kind of import the contracts forbid (the notebook's side importing the
gate; in the gate, an import back up its layers: the engine importing the HTTP
service, the engines the SQL passes, the ledger the engine, dp/ the SQL passes, the
policy dp/) is caught by ``lint-imports``, run on a copy of the package with one
such import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# Commands that start, supervise or set up a gate: they may import it.
COMMANDS = {"__init__", "__main__", "cli", "demo", "init_policy", "lab", "supervisor"}


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def test_the_notebooks_side_lists_every_module_but_the_commands():
    (client,) = [c for c in _contracts() if c.get("forbidden_modules") == ["dpmagic.gate"]]
    modules = {p.stem for p in (ROOT / "dpmagic").glob("*.py")}
    assert {m.removeprefix("dpmagic.") for m in client["source_modules"]} == modules - COMMANDS


def _layers() -> list[str]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    return [m.strip() for layer in layers["layers"] for m in layer.replace(":", "|").split("|")]


def test_the_gates_layers_list_every_package_and_module_of_the_gate():
    gate = ROOT / "dpmagic" / "gate"
    found = {p.stem for p in gate.glob("*.py") if p.stem != "__init__"}
    found |= {p.name for p in gate.iterdir() if (p / "__init__.py").exists()}
    assert sorted(m.removeprefix("dpmagic.gate.") for m in _layers()) == sorted(found)


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


def _copy(folder: Path) -> Path:
    shutil.copytree(ROOT / "dpmagic", folder / "dpmagic", ignore=shutil.ignore_patterns(
        "__pycache__", "labextension", "examples"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    return folder


def test_the_package_as_it_is_keeps_every_contract(tmp_path):
    kept = _lint(_copy(tmp_path))
    assert kept.returncode == 0, kept.stdout


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("dpmagic.render", "dpmagic.gate.engine"),  # the notebook's side, the gate
        ("dpmagic.gate.engine", "dpmagic.gate.service.routes"),  # HTTP under the engine
        ("dpmagic.gate.engines.interface", "dpmagic.gate.sql.ranks"),  # passes under engines
        ("dpmagic.gate.ledger.store", "dpmagic.gate.engine"),  # the engine under the ledger
        ("dpmagic.gate.dp.counts", "dpmagic.gate.sql.plan"),  # the passes under dp/
        ("dpmagic.gate.policy.values", "dpmagic.gate.dp.accounting"),  # dp/ under the policy
    ],
)
def test_an_import_the_contracts_forbid_is_caught(tmp_path, module, imported):
    folder = _copy(tmp_path)
    source = folder / (module.replace(".", "/") + ".py")
    source.write_text(source.read_text() + f"\nimport {imported}  # noqa\n")
    broken = _lint(folder)
    assert broken.returncode != 0
    assert f"{module} -> {imported}" in broken.stdout
