"""The columnar reply (``dpmagic/wire.py``): what JSON would carry comes back from Arrow,
the stored batches are sent as written, and a ``DPResult`` read from the columns
shows what one read from JSON shows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dpmagic import wire
from dpmagic.display.result import DPResult
from dpmagic.gate.reply import Reply
from dpmagic.protocol import WIRE_VERSION

BIG = 2**70 + 3  # an exact sum beyond 64 bits


def _reply() -> dict:
    return {
        "dataset": "d",
        "columns": ["k", "n", "s", "a", "flag", "mixed", "day"],
        "rows": [
            [1, 5, BIG, 2.5, True, 1, "2026-01-02"],
            [2, None, -(2**100), float("inf"), None, "x", None],
            [3, 0, 7, float("nan"), False, 2.5, "2026-01-03"],
        ],
        "cost": {"epsilon": 1.0, "delta": 0.0},
        "accuracy": {
            "alpha": 0.05,
            "columns": [
                None,
                {
                    "rule": "zero",
                    "intervals": [[1.0, 9.0], None, [0.0, 4.0]],
                    "noise_dominates": [False, None, True],
                    "measurements": ["COUNT(*)", "x", "y"],  # a list of the rows' length
                },
                {"rule": "zero", "intervals": np.array([[1.0, 2.0], [np.nan, np.nan], [3, 4]])},
                None,
                None,
                None,
                None,
            ],
        },
        "budget": {
            "user": {
                "spent": {"epsilon": 1.0, "delta": 0.0},
                "limit": {"epsilon": 3.0, "delta": 0.0},
                "remaining": {"epsilon": 2.0, "delta": 0.0},
            }
        },
        "replayed": False,
        "dry_run": False,
    }


def _as_json(reply: dict) -> dict:
    """What a JSON reply decodes to (non-finite floats are null, arrays are lists)."""

    def plain(value: object) -> object:
        if isinstance(value, np.ndarray):
            return [None if np.isnan(p).any() else p.tolist() for p in value]
        if isinstance(value, float) and not np.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return json.loads(json.dumps(plain(reply)))


def test_a_reply_read_back_from_arrow_is_what_json_carries() -> None:
    reply = _reply()
    envelope, table = wire.split(reply)
    back = wire.merged(*wire.read(wire.write(envelope, table)))
    assert back == _as_json(reply)
    assert back["rows"][0][2] == BIG and back["rows"][1][2] == -(2**100)  # exact


def test_values_travel_as_arrow_types_and_only_what_arrow_cannot_hold_as_json_text() -> None:
    _, table = wire.split(_reply())
    types = {f.name: f.type for f in table.schema}
    assert types["k"] == pa.int64() and types["a"] == pa.float64()
    assert types["flag"] == pa.bool_() and types["n intervals.lower"] == pa.float64()
    marked = {f.name for f in table.schema if (f.metadata or {}).get(wire.ENCODING) == b"json"}
    assert marked == {"s", "mixed"}  # beyond 64 bits; ints mixed with text and floats
    assert table.column("a").null_count == 2  # inf and nan: null, as JSON sends them


def test_restamp_sends_the_stored_batches_unchanged_under_a_new_envelope() -> None:
    envelope, table = wire.split(_reply())
    stored = wire.write({**envelope, "budget": None}, table)
    sent = wire.restamp(stored, {**envelope, "replayed": True})
    head = len(pa.ipc.read_schema(pa.py_buffer(stored)).serialize())
    assert sent.endswith(stored[head:])  # the record batch bytes, not written again
    got, again = wire.read(sent)
    assert got["replayed"] is True and again.equals(table)
    with pytest.raises(ValueError):
        wire.restamp(b"{}" + bytes(8), envelope)


def test_columns_of_numpy_vectors_are_sent_as_they_are() -> None:
    values = wire.Columns([np.array([3, 1]), np.array([0.5, np.inf]), ["a", "b"]])
    reply = {"columns": ["n", "x", "k"], "rows": values, "accuracy": {"columns": []}}
    envelope, table = wire.split(reply)
    assert wire.merged(envelope, table)["rows"] == [[3, 0.5, "a"], [1, None, "b"]]
    assert values.rows == [[3, 0.5, "a"], [1, None, "b"]]  # as JSON carries it


def test_a_stored_json_reply_of_an_older_gate_is_replayed_alike() -> None:
    reply = _as_json(_reply())
    old = Reply.stored(json.dumps(reply))
    now = {**reply, "version": WIRE_VERSION, "plan": []}  # read as this version's reply
    assert old.json() == now
    assert wire.merged(*wire.read(old.arrow())) == now


def _both(reply: dict) -> tuple[DPResult, DPResult]:
    envelope, table = wire.split(reply)
    decoded = wire.read(wire.write(envelope, table))
    return DPResult(_as_json(reply)), DPResult(decoded[0], cells=decoded[1])


def test_a_result_read_from_columns_shows_what_one_read_from_json_shows() -> None:
    from_json, from_arrow = _both(_reply())
    assert from_arrow.rows == from_json.rows
    pd.testing.assert_frame_equal(from_arrow.df, from_json.df)
    pd.testing.assert_frame_equal(from_arrow.interval("n"), from_json.interval("n"))
    pd.testing.assert_frame_equal(from_arrow.interval("s"), from_json.interval("s"))
    assert from_arrow.noise_dominates("n") == from_json.noise_dominates("n") == [False, None, True]
    assert from_arrow.keys == from_json.keys
    assert len(from_arrow) == len(from_json) == 3
    assert from_arrow.footer() == from_json.footer()
    assert repr(from_arrow) == repr(from_json)
    assert from_arrow._repr_html_() == from_json._repr_html_()
    assert from_arrow.reply == from_json.reply
    assert from_arrow.df["s"].tolist() == [BIG, -(2**100), 7]


def test_a_result_made_from_columns_makes_no_rows_until_asked() -> None:
    _, from_arrow = _both(_reply())
    from_arrow.df  # noqa: B018 - the DataFrame comes from the columns
    assert "rows" not in vars(from_arrow) and "accuracy" not in vars(from_arrow)


def test_a_quantile_band_and_a_dry_run_read_from_columns() -> None:
    reply = {
        "columns": ["k", "q"],
        "rows": [[1, 4.0], [2, 6.0]],
        "accuracy": {
            "alpha": 0.05,
            "columns": [
                None,
                {"rule": "percentiles", "rank_radius": 3.0, "percentiles": [[0.4, 0.6], None],
                 "intervals": [[3.0, 5.0], [5.0, 7.0]], "noise_dominates": [False, None]},
            ],
        },
    }  # fmt: skip
    from_json, from_arrow = _both(reply)
    pd.testing.assert_frame_equal(from_arrow.percentiles("q"), from_json.percentiles("q"))
    accuracy = {"alpha": 0.05, "columns": []}
    dry = {"columns": ["n"], "rows": [], "dry_run": True, "accuracy": accuracy}
    from_json, from_arrow = _both(dry)
    assert from_arrow.rows == [] and len(from_arrow) == 0
    assert list(from_arrow.df.columns) == ["n"]


def test_a_large_batch_is_compressed_and_a_small_one_is_not() -> None:
    """LZ4 frames only where they pay (``wire.COMPRESS_FROM``); both read back alike."""
    big = wire.Columns([np.zeros(100_000, dtype=np.int64)])
    small = wire.Columns([np.zeros(10, dtype=np.int64)])
    sizes = {}
    for name, values in (("big", big), ("small", small)):
        envelope, table = wire.split({"columns": ["n"], "rows": values})
        stream = wire.write(envelope, table)
        sizes[name] = len(stream), table.nbytes
        assert wire.read(stream)[1].equals(table)
    assert sizes["big"][0] < sizes["big"][1] / 10  # zeros compress
    assert sizes["small"][0] > sizes["small"][1]  # sent as they are, with the schema
