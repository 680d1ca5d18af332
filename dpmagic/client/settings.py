"""``[tool.dpmagic]`` in the nearest ``pyproject.toml``: a project's defaults.

A course or a research project keeps its gate address, dataset and default ε
next to its notebooks, as JupySQL users keep ``[tool.jupysql.SqlMagic]``.
The nearest ``pyproject.toml`` from the kernel's working folder upwards is
read when the extension loads; ``%config DpSql.*`` still wins afterwards.
A bad key or value is reported and skipped, never fatal: a notebook must
load even if its project file is wrong.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traitlets import HasTraits, TraitError

FILE = "pyproject.toml"


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` in ``start`` or a folder above it."""
    for folder in (start, *start.parents):
        candidate = folder / FILE
        if candidate.is_file():
            return candidate
    return None


def read_settings(path: Path) -> dict[str, Any]:
    """The ``[tool.dpmagic]`` table of ``path`` (empty if it has none)."""
    with path.open("rb") as f:
        data = tomllib.load(f)
    table = data.get("tool", {}).get("dpmagic", {})
    if not isinstance(table, dict):
        raise ValueError("[tool.dpmagic] must be a table")
    return table


def apply_settings(target: HasTraits, settings: dict[str, Any]) -> Iterator[str]:
    """Set each configurable trait named in ``settings``; yield a line per key skipped."""
    known = set(target.trait_names(config=True))
    for key, value in settings.items():
        if key not in known:
            yield f"unknown key {key!r} (known: {', '.join(sorted(known))})"
            continue
        try:
            setattr(target, key, value)
        except TraitError:
            yield f"{key} = {value!r} is not a valid value"


def load_project_settings(target: HasTraits, start: Path) -> tuple[Path | None, list[str]]:
    """Apply the nearest ``[tool.dpmagic]`` to ``target``; the file used and any warnings."""
    path = find_pyproject(start)
    if path is None:
        return None, []
    try:
        settings = read_settings(path)
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        return path, [f"cannot read it: {' '.join(str(exc).split())}"]
    if not settings:
        return None, []
    return path, list(apply_settings(target, settings))
