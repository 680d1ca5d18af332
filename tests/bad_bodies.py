"""Malformed request bodies, one per kind the parser must refuse, shared by the
body parser's unit tests and the real gate's system tests."""

from __future__ import annotations

import json

from dpmagic.gate.service.body import MAX_DEPTH

SQL = "SELECT COUNT(*) FROM t"
NOTHING = "nothing was charged"


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# Each a whole request body, as bytes on the wire.
BAD_BODIES = {
    "int with 400 digits": f'{{"sql": "{SQL}", "epsilon": 1{"0" * 399}}}',
    "int past Python's 4300-digit limit": f'{{"sql": "{SQL}", "epsilon": {"9" * 5000}}}',
    "float that overflows": f'{{"sql": "{SQL}", "epsilon": 1e400}}',
    "float with 300 digits": f'{{"sql": "{SQL}", "epsilon": 0.{"1" * 300}}}',
    "NaN": f'{{"sql": "{SQL}", "epsilon": NaN}}',
    "Infinity": f'{{"sql": "{SQL}", "accuracy": Infinity}}',
    "nested 100,000 deep": f'{{"sql": "{SQL}", "params": {{"a": {nested(100_000)}}}}}',
    "nested just past the limit": f'{{"sql": "{SQL}", "params": {{"a": {nested(MAX_DEPTH)}}}}}',
    "a 900 kB notebook name": json.dumps({"sql": SQL, "notebook": "n" * 900_000}),
    "a 900 kB dataset name": json.dumps({"sql": SQL, "dataset": "d" * 900_000}),
    "a 900 kB unknown field": json.dumps({"sql": SQL, "x" * 900_000: 1}),
    "not UTF-8": '{"sql": "\udcff"}',
    "a flag that is a string": json.dumps({"sql": SQL, "fresh": "yes"}),
}


def wire(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")
