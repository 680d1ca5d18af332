"""Reading a policy file: its TOML, then :func:`parsing.parse_policy`."""

from __future__ import annotations

import tomllib
from pathlib import Path

from dpmagic.gate.policy.parsing import parse_policy
from dpmagic.gate.policy.values import Policy, PolicyError


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy TOML file; relative paths are resolved
    against the file's folder so a policy can travel with its data."""
    path = Path(path).resolve()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path.name}: not valid TOML: {exc}") from None
    return parse_policy(raw, path)
