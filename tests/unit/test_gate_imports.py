"""What the gate's process imports: its resident memory at rest is its imports (goal 4
of docs/speed.md, the gate's peak within 1.5× of raw DuckDB's), so the heavy optional
parts stay out. OpenDP's prelude loads ``opendp.extras`` (its scikit-learn helpers, and
Polars where installed: 24 MB of the gate's 158 MB at rest); the gate imports OpenDP's
modules one by one instead. pandas is imported only by a query that post-processes
(``HAVING``, ``ORDER BY``, ``LIMIT``)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("opendp.extras", "opendp.prelude", "polars", "pandas", "sklearn")


def _heavy(statement: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after ``statement``."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [
        m for m in json.loads(out.stdout) if m == m.split(".")[0] in HEAVY or m.startswith(HEAVY)
    ]


def test_the_serving_gate_imports_none_of_the_heavy_optional_parts() -> None:
    assert _heavy("import dpmagic.gate.service.server") == []


def test_a_gate_module_importing_the_prelude_is_caught() -> None:
    assert _heavy("import dpmagic.gate.service.server; import opendp.prelude")
