"""A query's reply in columns: one Arrow IPC stream, written by the gate, read by the client.

A reply of 100,000 groups is 100,000 rows of values plus, for each noisy column, an
interval and a verdict per cell. As JSON that is a few hundred thousand Python
objects made, encoded, stored, sent, parsed and made again; as Arrow it is a few
arrays, written once and read without a Python object per cell. The stream is
Arrow's own IPC format, which pandas, polars, DuckDB and every Arrow library read:

- one record batch: a field per output column (its values), then for each noisy
  column its per-cell parts (``CELL_PARTS``: the interval's ends, the band of
  percentiles' ends, the verdict on noise dominance), each field naming in its
  metadata the output column and part it holds;
- the schema's metadata ``dpmagic``: the rest of the reply as JSON (its cost, plan,
  budget, accuracy without the per-cell lists), the *envelope*.

Values are what the JSON reply would carry, so both decode to the same rows: integers
as int64, floats as float64 (null where JSON has null: not finite), text, booleans,
nulls. A column whose values Arrow cannot hold as one of those types without loss
(an integer beyond 64 bits, an exact sum can be; a column mixing types) travels as
text, each cell its JSON, the field marked ``dpmagic.encoding = json``.

This module runs in the gate and in the untrusted client alike: it imports nothing
from ``dpmagic.gate``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpmagic.protocol import CELL_FIELDS, CELL_PAIRS, CELL_VERDICTS

ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"
ENVELOPE = b"dpmagic"
COLUMN = b"dpmagic.column"  # the output column a field belongs to (its index)
PART = b"dpmagic.part"  # "value", or one of CELL_PARTS with its end
ENCODING = b"dpmagic.encoding"  # "json": each cell a JSON text
# Per-cell lists of an accuracy column that travel as fields: pairs and verdicts.
PAIRS = CELL_PAIRS
VERDICTS = CELL_VERDICTS
CELL_PARTS = CELL_FIELDS
ENDS = ("lower", "upper")
_CONTINUATION = 0xFFFFFFFF
# The record batch's buffers are compressed with LZ4 frames, as Arrow's IPC format
# allows (pyarrow, polars, DuckDB, arrow-rs and Arrow Java read them): 100,000 groups'
# 5.6 MB become 2.4 MB for 4.5 ms, which the ledger then stores in 2–12 ms rather than
# 22–30 ms (a write past SQLite's 4 MB checkpoint copies it again), and the client
# reads in 1.7 ms. Below COMPRESS_FROM bytes the frames cost more than they save
# (a 50-row reply: 0.07 ms written compressed, 0.02 ms not).
COMPRESSION = "lz4"
COMPRESS_FROM = 64 << 10


def split(reply: dict[str, Any]) -> tuple[dict[str, Any], pa.Table]:
    """The envelope (the reply less its rows and per-cell lists) and the cells, as a
    table. ``reply["rows"]`` is a list of rows, or a ``Columns`` of column vectors;
    each per-cell list is a list or a numpy array (pairs as an ``(n, 2)`` array, NaN
    where JSON has null)."""
    envelope = {k: v for k, v in reply.items() if k != "rows"}
    rows = reply.get("rows") or []
    names = list(reply.get("columns") or [])
    if not names and len(rows):  # a reply that does not name its columns: by position
        width = len(rows.vectors) if isinstance(rows, Columns) else len(rows[0])
        names = [str(j) for j in range(width)]
    columns = rows.vectors if isinstance(rows, Columns) else _transposed(rows, len(names))
    fields, arrays = [], []
    for j, (name, values) in enumerate(zip(names, columns, strict=True)):
        array, as_json = _values(values)
        meta = {COLUMN: str(j).encode(), PART: b"value"}
        if as_json:
            meta[ENCODING] = b"json"
        fields.append(pa.field(name, array.type, metadata=meta))
        arrays.append(array)
    accuracy = reply.get("accuracy")
    if isinstance(accuracy, dict) and isinstance(accuracy.get("columns"), list):
        kept = []
        for j, info in enumerate(accuracy["columns"]):
            if not isinstance(info, dict):
                kept.append(info)
                continue
            kept.append({k: v for k, v in info.items() if k not in CELL_PARTS})
            name = names[j] if j < len(names) else str(j)
            for part in CELL_PARTS:
                if info.get(part) is not None:
                    for label, array in _part(part, info[part]):
                        meta = {COLUMN: str(j).encode(), PART: label.encode()}
                        fields.append(pa.field(f"{name} {label}", array.type, metadata=meta))
                        arrays.append(array)
        envelope["accuracy"] = {**accuracy, "columns": kept}
    return envelope, pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class Columns:
    """Released values column by column (numpy arrays or lists), as the gate's release
    pass makes them; ``rows`` only for a reader that wants them row by row."""

    def __init__(self, vectors: Sequence[Sequence[Any] | np.ndarray]) -> None:
        self.vectors = list(vectors)

    def __len__(self) -> int:
        return len(self.vectors[0]) if self.vectors else 0

    @property
    def rows(self) -> list[list[Any]]:
        """The rows as the JSON reply carries them (a float array's non-finite values as
        None)."""
        lists = [_listed(v) for v in self.vectors]
        if not lists:
            return []
        return [list(row) for row in zip(*lists, strict=True)]


def _listed(vector: Sequence[Any] | np.ndarray) -> list[Any]:
    if not isinstance(vector, np.ndarray):
        return list(vector)
    values = vector.tolist()
    if vector.dtype.kind == "f":
        for i in np.flatnonzero(~np.isfinite(vector)).tolist():
            values[i] = None
    return values


def write(envelope: dict[str, Any], table: pa.Table) -> bytes:
    """The IPC stream of ``table`` with ``envelope`` in its schema's metadata, its buffers
    compressed with LZ4 when it is large (``COMPRESSION``)."""
    schema = table.schema.with_metadata({ENVELOPE: _json(envelope)})
    sink = pa.BufferOutputStream()
    large = table.nbytes >= COMPRESS_FROM
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSION if large else None)
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
    return sink.getvalue().to_pybytes()


def restamp(stream: bytes, envelope: dict[str, Any]) -> bytes:
    """``stream`` with ``envelope`` in place of its own: a new schema message before
    the stream's record batches, which are sent as they were written, not encoded
    again (Arrow's IPC stream is a schema message, then the batches, each framed by
    its length: https://arrow.apache.org/docs/format/Columnar.html#encapsulated-message-format)."""
    marker, length = struct.unpack_from("<Ii", stream, 0)
    if marker != _CONTINUATION or length <= 0:
        raise ValueError("not an Arrow IPC stream")
    schema = pa.ipc.read_schema(pa.py_buffer(stream))
    head = schema.with_metadata({ENVELOPE: _json(envelope)}).serialize().to_pybytes()
    return head + stream[8 + length :]


def read(data: bytes | memoryview) -> tuple[dict[str, Any], pa.Table]:
    """The envelope and the table of a stream ``write`` made (zero-copy)."""
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    meta = table.schema.metadata or {}
    envelope = json.loads(meta.get(ENVELOPE, b"{}"))
    if not isinstance(envelope, dict):
        raise ValueError("the reply's envelope is not a JSON object")
    return envelope, table


def merged(envelope: dict[str, Any], table: pa.Table) -> dict[str, Any]:
    """The reply as JSON carries it: rows and per-cell lists put back."""
    reply = dict(envelope)
    found = fields(table)
    width = max([len(envelope.get("columns") or []), *(j + 1 for j, _ in found)])
    columns = [values(table, found, j) for j in range(width)]
    reply["rows"] = [list(row) for row in zip(*columns, strict=True)] if columns else []
    accuracy = envelope.get("accuracy")
    if isinstance(accuracy, dict) and isinstance(accuracy.get("columns"), list):
        restored = []
        for j, info in enumerate(accuracy["columns"]):
            if isinstance(info, dict):
                info = {**info, **cell_parts(table, found, j)}
            restored.append(info)
        reply["accuracy"] = {**accuracy, "columns": restored}
    return reply


def values(table: pa.Table, fields: dict[tuple[int, str], int], j: int) -> list[Any]:
    """Output column ``j``'s values as JSON would carry them."""
    index = fields.get((j, "value"))
    if index is None:
        return [None] * table.num_rows
    column = table.column(index)
    if (table.schema.field(index).metadata or {}).get(ENCODING) == b"json":
        return [None if v is None else json.loads(v) for v in column.to_pylist()]
    return column.to_pylist()


def cell_parts(table: pa.Table, fields: dict[tuple[int, str], int], j: int) -> dict[str, Any]:
    """Output column ``j``'s per-cell lists as JSON would carry them."""
    out: dict[str, Any] = {}
    for part in PAIRS:
        ends = [fields.get((j, f"{part}.{end}")) for end in ENDS]
        if None not in ends:
            lo, hi = (table.column(i).to_pylist() for i in ends)
            out[part] = [
                None if a is None or b is None else [a, b] for a, b in zip(lo, hi, strict=True)
            ]
    for part in VERDICTS:
        index = fields.get((j, part))
        if index is not None:
            out[part] = table.column(index).to_pylist()
    return out


def fields(table: pa.Table) -> dict[tuple[int, str], int]:
    """Each field's index by (output column, part): ``"value"``, ``"intervals.lower"`` …"""
    out = {}
    for i, f in enumerate(table.schema):
        meta = f.metadata or {}
        if COLUMN in meta and PART in meta:
            out[(int(meta[COLUMN]), meta[PART].decode())] = i
    return out


def _transposed(rows: Sequence[Sequence[Any]], width: int) -> list[Sequence[Any]]:
    if not rows:
        return [[] for _ in range(width)]
    return list(zip(*rows, strict=True))


def _values(values: Sequence[Any] | np.ndarray) -> tuple[pa.Array, bool]:
    """An output column's values as an Arrow array, and whether it holds JSON texts."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "f":
            return pa.array(values, mask=~np.isfinite(values)), False
        if values.dtype.kind in "iub":
            return pa.array(values), False
        values = values.tolist()
    kinds = set(map(type, values)) - {type(None)}
    if not kinds:
        return pa.nulls(len(values)), False
    if len(kinds) == 1:
        arrow = _ARROW_TYPES.get(next(iter(kinds)))
        if arrow is not None:
            try:
                array = pa.array(values, type=arrow)
            except (OverflowError, pa.ArrowInvalid):  # an integer beyond 64 bits
                pass
            else:
                if arrow == pa.float64():  # null where JSON has null: not finite
                    array = pc.if_else(pc.is_finite(array), array, pa.scalar(None, pa.float64()))
                return array, False
    texts = [None if v is None else json.dumps(v) for v in values]
    return pa.array(texts, type=pa.string()), True


_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def _part(part: str, cells: Any) -> list[tuple[str, pa.Array]]:
    """A per-cell list's fields: a pair's two ends (null where the pair is), or the
    verdicts (true, false, or null where the gate cannot tell)."""
    if part in VERDICTS:
        if isinstance(cells, np.ndarray):
            return [(part, pa.array(cells.astype(bool)))]
        return [(part, pa.array(list(cells), type=pa.bool_()))]
    if isinstance(cells, np.ndarray):
        ends = np.asarray(cells, dtype=float).reshape(-1, 2)
    else:
        ends = np.array(
            [(np.nan, np.nan) if p is None else (p[0], p[1]) for p in cells], dtype=float
        ).reshape(-1, 2)
    unknown = ~(np.isfinite(ends[:, 0]) & np.isfinite(ends[:, 1]))
    return [(f"{part}.{end}", pa.array(ends[:, i], mask=unknown)) for i, end in enumerate(ENDS)]


def _json(envelope: dict[str, Any]) -> bytes:
    """The envelope as the JSON reply would encode it (a date as text)."""
    return json.dumps(envelope, default=str).encode()
