"""A ``/v1/query`` answer as the engine hands it to the server: its envelope (cost,
plan, budget …, a `protocol.QueryReply` without its cells) and its cells as an Arrow
IPC stream (``dpmagic/wire.py``).

The stream is written once, when the answer is released, and that is what the ledger
stores for replays; an Arrow reply is that stream with the reply's own envelope put
in front of its record batches (``wire.restamp``), so a reply of 100,000 groups is
neither encoded twice nor made into a Python object per cell. A client that asks for
JSON gets the cells read back into lists, as the API has always sent them.
"""

from __future__ import annotations

import json
from typing import Any

from msgspec.structs import replace

from dpmagic import wire
from dpmagic.protocol import QueryReply, reply_of


class Reply:
    """``envelope``: the reply without its cells, which the engine may still add to (the
    budget, ``replayed``, ``fresh_because``); ``stream``: the cells as the ledger keeps
    them (written with the envelope of the release, replaced when sent)."""

    def __init__(self, envelope: QueryReply, stream: bytes) -> None:
        self.envelope = envelope
        self.stream = stream

    @classmethod
    def of(cls, reply: QueryReply) -> Reply:
        """A reply whose rows and per-cell lists are still in it (lists or numpy arrays,
        which the envelope's JSON cannot hold: they go to the stream's columns)."""
        rows, accuracy = reply.rows, reply.accuracy
        plain = replace(reply, rows=[], accuracy=None).json()
        if accuracy is not None:
            plain["accuracy"] = accuracy.carried()
        envelope, table = wire.split({**plain, "rows": rows})
        return cls(reply_of(envelope), wire.write(envelope, table))

    @classmethod
    def stored(cls, kept: bytes | str) -> Reply:
        """A reply as the ledger kept it: an Arrow stream, or the JSON text of a ledger
        written before replies were columnar. An older gate's envelope is read as this
        version's (``protocol.reply_of``), so it replays."""
        if isinstance(kept, bytes):
            envelope, _ = wire.read(kept)
            return cls(reply_of(envelope, migrate=True), kept)
        whole = json.loads(kept)
        rows = whole.get("rows") or []
        reply = reply_of({k: v for k, v in whole.items() if k != "rows"}, migrate=True)
        return cls.of(replace(reply, rows=rows))

    def json(self) -> dict[str, Any]:
        """The whole reply as JSON carries it: rows and per-cell lists as lists."""
        _, table = wire.read(self.stream)
        return wire.merged(self.envelope.json(), table)

    def arrow(self) -> bytes:
        """The reply as an Arrow IPC stream: the stored batches under this envelope."""
        return wire.restamp(self.stream, self.envelope.json())
