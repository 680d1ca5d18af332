"""The peers' side of the benchmarks: each peer (SmartNoise SQL, OpenDP's Polars front
end) in a virtual environment of its own, made once under ``.data/``, and one tool's
timed run of a workload (``tools.py``) in a given Python. Shared by ``run.py``,
``visits.py`` and ``many_groups.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from data import CACHE

HERE = Path(__file__).resolve().parent


def _opendp_polars() -> list[str]:
    """Our OpenDP version with the Polars it pins (it refuses others), without the
    rest of its ``polars`` extra (scikit-learn and friends are not used here)."""
    pin = next(
        r.split(";")[0].strip()
        for r in metadata.requires("opendp") or []
        if r.startswith("polars") and 'extra == "polars"' in r
    )
    return [f"opendp=={metadata.version('opendp')}", pin, "pyarrow", "numpy"]


PEERS = {"smartnoise": lambda: ["smartnoise-sql", "duckdb"], "opendp-polars": _opendp_polars}


def tool_run(
    name: str, python: str, data: Path, reps: int, epsilon: float, workload: str = "bench"
) -> dict:
    """``tools.py``'s run of one tool on a workload's data, in ``python``."""
    cmd = [python, str(HERE / "tools.py"), name, str(data), "--workload", workload,
           "--reps", str(reps), "--epsilon", str(epsilon)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def peer_python(peer: str) -> Path:
    """A virtual environment of the peer's own (they pin their own OpenDP or Polars),
    made once."""
    venv = CACHE / f"venv-{peer}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEERS[peer]()], check=True)
    return python
