"""The benchmark's synthetic dataset, generated deterministically and cached.

``visits``: one row per visit of a person (1 to 5 each): the person's ``age``,
``income`` and ``state`` (50, unevenly populated) and the visit's
``diagnosis`` (20, unevenly frequent). ``persons``: one row per person, with
``sex`` and ``enrolled`` (a year), for the join. A numpy PCG64 stream with a
fixed seed makes the same rows on every machine; the files are written once
per size under ``benchmarks/.data/`` (not in git).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

SEED = 20261122
STATES = 50
DIAGNOSES = 20
CACHE = Path(__file__).resolve().parent / ".data"


def dataset(rows: int, cache: Path = CACHE) -> Path:
    """The folder holding ``visits.parquet``, ``persons.parquet`` and ``raw.duckdb``."""
    folder = cache / f"rows-{rows}"
    if (folder / "raw.duckdb").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    visits, persons = _generate(rows)
    con = duckdb.connect()
    con.register("v", visits)
    con.register("p", persons)
    con.execute(f"COPY v TO '{folder / 'visits.parquet'}' (FORMAT parquet)")
    con.execute(f"COPY p TO '{folder / 'persons.parquet'}' (FORMAT parquet)")
    con.close()
    partial = folder / "raw.duckdb.partial"
    partial.unlink(missing_ok=True)
    raw = duckdb.connect(str(partial))
    raw.execute(f"CREATE TABLE visits AS FROM '{folder / 'visits.parquet'}'")
    raw.execute(f"CREATE TABLE persons AS FROM '{folder / 'persons.parquet'}'")
    raw.close()
    partial.rename(folder / "raw.duckdb")
    return folder


def _generate(rows: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.Generator(np.random.PCG64(SEED))
    people = rows // 2 + 5  # visits average 3: enough people to reach ``rows``
    visits_each = rng.integers(1, 6, size=people)
    ends = np.cumsum(visits_each)
    people = int(np.searchsorted(ends, rows)) + 1
    visits_each = visits_each[:people]
    visits_each[-1] -= int(ends[people - 1]) - rows
    pid = np.arange(1, people + 1, dtype=np.int64)
    age = rng.integers(0, 101, size=people)
    income = np.minimum(np.round(rng.lognormal(10.4, 0.9, size=people), 2), 500_000.0)
    state_weights = 1.0 / np.arange(1, STATES + 1) ** 0.8
    state = rng.choice(STATES, size=people, p=state_weights / state_weights.sum())
    sex = rng.integers(0, 2, size=people)
    enrolled = rng.integers(2000, 2026, size=people)
    diag_weights = 1.0 / np.arange(1, DIAGNOSES + 1) ** 1.1
    diagnosis = rng.choice(DIAGNOSES, size=rows, p=diag_weights / diag_weights.sum())
    visits = {
        "pid": np.repeat(pid, visits_each),
        "age": np.repeat(age, visits_each),
        "income": np.repeat(income, visits_each),
        "state": np.repeat(state, visits_each),
        "diagnosis": diagnosis,
    }
    persons = {"pid": pid, "sex": sex, "enrolled": enrolled}
    return visits, persons


def row_count(text: str) -> int:
    """Rows as ``--rows`` takes them: ``1M``, ``10M``, ``500K`` or digits."""
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)
