"""Mock runs: a query answered on fake tables made from the public schema alone.

Students debug their SQL here before spending budget. Why it is safe: this
module runs in the kernel and never sends the query anywhere. Its only input
from the gate is ``GET /v1/schema``, the public policy (names, types,
declared bounds and public values) that ``%dpschema`` already shows; the
fake rows are drawn from those declarations with a fixed seed, so they carry
nothing of the real data, and the query runs on them in an in-memory DuckDB
of the kernel's own with external access off. The gate's private files are
never opened, and nothing is charged.

The answers are exact on fake data, not noisy: they show the shape of the
result (columns, groups, types), never anything about the dataset, and
every display says so ("mock data — not the real dataset").
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd

from dpmagic.client.errors import DPError
from dpmagic.display.cells import ALPHA
from dpmagic.display.render import MOCK_LABEL
from dpmagic.display.result import DPResult
from dpmagic.protocol import Accuracy, Mock, QueryReply

DEFAULT_UNITS = 1000
"""Privacy units in a mock dataset unless ``--mock-rows`` says otherwise."""
SEED = 20240601
"""Fixed, so a mock run gives the same table every time."""
UNBOUNDED_INT = (0, 999)
UNBOUNDED_FLOAT = (0.0, 1000.0)
UNBOUNDED_DATE = (dt.date(2020, 1, 1), dt.date(2024, 12, 31))
FREE_TEXT_VALUES = 10


def mock_tables(schema: dict[str, Any], units: int = DEFAULT_UNITS) -> dict[str, pd.DataFrame]:
    """A fake table for each declared one, drawn within the declared bounds and values.

    A private table that holds the privacy unit has one row per unit; one that
    links to it has one to ``max_rows_per_partition`` rows per unit; a public
    table has ``units`` rows.
    """
    if units < 1:
        raise DPError("--mock-rows needs at least 1 row", kind="bad_request")
    rng = np.random.default_rng(SEED)
    per_unit = max(1, int(schema.get("max_rows_per_partition") or 1))
    tables = schema.get("tables") or {}
    frames = {}
    for name, table in tables.items():
        unit = None if table.get("public") else table.get("unit") or schema.get("privacy_unit")
        links = table.get("links") or {}
        linked = unit in links
        ids = np.arange(1, units + 1)
        if linked:
            ids = np.repeat(ids, rng.integers(1, per_unit + 1, size=units))
        rows = len(ids)
        data = {}
        for column, info in (table.get("columns") or {}).items():
            if column == unit or column in links:
                data[column] = ids if column == unit else rng.integers(1, units + 1, size=rows)
            else:
                data[column] = _column(info, rows, column, rng)
        frames[name] = pd.DataFrame(data)
    return frames


def _column(info: dict[str, Any], rows: int, name: str, rng: np.random.Generator) -> Any:
    """Values of one declared column: its public values, else uniform within its bounds."""
    kind = str(info.get("type", ""))
    values = info.get("public_values")
    if values:
        return [values[i] for i in rng.integers(0, len(values), size=rows)]
    lower, upper = info.get("lower"), info.get("upper")
    if kind == "int":
        lo, hi = (lower, upper) if lower is not None and upper is not None else UNBOUNDED_INT
        return rng.integers(int(lo), int(hi) + 1, size=rows)
    if kind == "float":
        lo, hi = (lower, upper) if lower is not None and upper is not None else UNBOUNDED_FLOAT
        return np.round(rng.uniform(float(lo), float(hi), size=rows), 2)
    if kind == "bool":
        return rng.integers(0, 2, size=rows).astype(bool)
    if kind == "date":
        lo, hi = (
            (dt.date.fromisoformat(str(lower)), dt.date.fromisoformat(str(upper)))
            if lower is not None and upper is not None
            else UNBOUNDED_DATE
        )
        days = rng.integers(0, (hi - lo).days + 1, size=rows)
        return [lo + dt.timedelta(days=int(d)) for d in days]
    return [f"{name}_{i}" for i in rng.integers(0, FREE_TEXT_VALUES, size=rows)]


def mock_query(
    sql: str,
    schema: dict[str, Any],
    params: dict[str, Any] | None = None,
    units: int | None = None,
) -> DPResult:
    """Run ``sql`` on mock tables in a private in-memory DuckDB; costs nothing."""
    import duckdb  # here, not above: a kernel loads DuckDB only if it runs a mock

    units = DEFAULT_UNITS if units is None else units
    con = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        for name, frame in mock_tables(schema, units).items():
            con.register(f"_mock_{name}", frame)
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM "_mock_{name}"')
            con.unregister(f"_mock_{name}")
        con.execute("SET lock_configuration = true")
        try:
            cursor = con.execute(sql, params or None)
            columns = [d[0] for d in cursor.description or []]
            rows = [[_plain(v) for v in row] for row in cursor.fetchall()]
        except duckdb.Error as exc:
            raise DPError(f"on {MOCK_LABEL}: {' '.join(str(exc).split())}", kind="mock") from None
    finally:
        con.close()
    return DPResult(
        QueryReply(
            dataset=str(schema.get("dataset", "")),
            columns=columns,
            rows=rows,
            accuracy=Accuracy(alpha=ALPHA, columns=[]),
            mock=Mock(units=units),
        )
    )


def _plain(value: Any) -> Any:
    """DuckDB's Decimal and date values as JSON-like scalars, as the gate sends them."""
    if hasattr(value, "is_finite") and not isinstance(value, float):  # Decimal
        return float(value)
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value
