"""The import contracts of ``pyproject.toml`` (``lint-imports`` runs them in CI): the
client side's packages are layers that import only downwards (commands, magics,
client, display, the shared wire), the notebook's side lists every top-level module
and package but the commands and the gate, and the gate's layers every package and
module of ``gate/``, so a new one is classified when it is added. Each contract is
shown catching a broken import: ``lint-imports`` run on a copy of the package with
one such import added (in the gate: the engine importing the HTTP service, the
engines the SQL passes, the ledger the engine, dp/ the SQL passes, the policy dp/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "dpmagic"
# The package's own entry modules, the commands that start, supervise or set up a
# gate (they may import it), and the gate itself.
NOT_THE_NOTEBOOKS_SIDE = {"__init__", "__main__", "commands", "gate"}


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def _packages() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def test_the_notebooks_side_lists_everything_but_the_commands():
    (client,) = [c for c in _contracts() if c.get("forbidden_modules") == ["dpmagic.gate"]]
    top_level = {p.stem for p in PACKAGE.glob("*.py")} | _packages()
    listed = {m.removeprefix("dpmagic.") for m in client["source_modules"]}
    assert listed == top_level - NOT_THE_NOTEBOOKS_SIDE


def _layers(gate: bool) -> dict:
    """The client side's layers contract (its container ``dpmagic``), or the gate's."""
    (layers,) = [c for c in _contracts() if c["type"] == "layers" and ("containers" in c) != gate]
    return layers


def test_every_package_of_the_client_side_is_a_layer():
    layers = _layers(gate=False)
    assert layers["containers"] == ["dpmagic"]
    named = {name.strip() for layer in layers["layers"] for name in layer.split("|")}
    assert _packages() - {"gate"} <= named
    assert layers["layers"][-2:] == ["wire", "protocol"]


def test_the_gates_layers_list_every_package_and_module_of_the_gate():
    named = [
        name.strip().removeprefix("dpmagic.gate.")
        for layer in _layers(gate=True)["layers"]
        for name in layer.replace(":", "|").split("|")
    ]
    gate = PACKAGE / "gate"
    found = {p.stem for p in gate.glob("*.py")} - {"__init__"}
    found |= {p.parent.name for p in gate.glob("*/__init__.py")}
    assert sorted(named) == sorted(found)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "dpmagic", ignore=shutil.ignore_patterns(
        "__pycache__", "labextension", "examples"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint(folder: Path) -> subprocess.CompletedProcess[str]:
    linter = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(linter), str(folder / "pyproject.toml")],
        cwd=folder,
        env={"PYTHONPATH": str(folder), "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )


def _add_import(folder: Path, module: str, imported: str) -> None:
    path = folder / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa\n")


def test_a_client_module_importing_the_gate_is_caught(tmp_path):
    folder = _copy(tmp_path)
    assert _lint(folder).returncode == 0
    _add_import(folder, "dpmagic.display.render", "dpmagic.gate.engine")
    broken = _lint(folder)
    assert broken.returncode != 0
    assert "dpmagic.display.render -> dpmagic.gate.engine" in broken.stdout


@pytest.mark.parametrize(
    ("module", "imported", "layer", "above"),
    [
        ("dpmagic.display.render", "dpmagic.client.http_gate", "display", "client"),
        ("dpmagic.client.mock", "dpmagic.magics.dpsql", "client", "magics"),
        ("dpmagic.magics.snippets", "dpmagic.commands.cli", "magics", "commands"),
        ("dpmagic.wire", "dpmagic.display.result", "wire", "display"),
    ],
)
def test_an_import_up_the_layers_is_caught(tmp_path, module, imported, layer, above):
    folder = _copy(tmp_path)
    assert _lint(folder).returncode == 0
    _add_import(folder, module, imported)
    broken = _lint(folder)
    assert broken.returncode != 0
    assert f"dpmagic.{layer} is not allowed to import dpmagic.{above}" in broken.stdout
    assert f"{module} -> {imported}" in broken.stdout


@pytest.mark.parametrize(
    ("module", "imported", "layer", "above"),
    [
        ("dpmagic.gate.engine", "dpmagic.gate.service.routes", "engine", "service"),
        ("dpmagic.gate.engines.interface", "dpmagic.gate.sql.ranks", "engines", "sql"),
        ("dpmagic.gate.ledger.store", "dpmagic.gate.engine", "ledger", "engine"),
        ("dpmagic.gate.dp.counts", "dpmagic.gate.sql.plan", "dp", "sql"),
        ("dpmagic.gate.policy.values", "dpmagic.gate.dp.accounting", "policy", "dp"),
    ],
)
def test_an_import_up_the_gates_layers_is_caught(tmp_path, module, imported, layer, above):
    folder = _copy(tmp_path)
    assert _lint(folder).returncode == 0
    _add_import(folder, module, imported)
    broken = _lint(folder)
    assert broken.returncode != 0
    assert f"dpmagic.gate.{layer} is not allowed to import dpmagic.gate.{above}" in broken.stdout
    assert f"{module} -> {imported}" in broken.stdout
