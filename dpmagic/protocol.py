"""The query request, one typed struct shared by the notebook's client and the gate.

``POST /v1/query`` carries an `Ask` as JSON. The client builds one from its keyword
arguments (``client.Gate.query``, the offline ``transcript.TranscriptGate`` alike)
and the gate decodes the body into the same struct (``gate/request.py``), so each
field is spelled once, here, with its type. The gate still judges each value's
range and which fields go together, with messages in the request's own words; this
module only says what the fields are.

msgspec, as for the policy file: its structs decode and check a body in one pass
without building an intermediate object per field, and forbid unknown fields.

This module runs in the gate and in the untrusted client alike: it imports nothing
from ``dpmagic.gate``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# The request's version: a gate refuses a newer one it cannot read, by name, rather
# than misreading a field whose meaning changed. A body without one is version 1.
WIRE_VERSION = 1


class Ask(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True, frozen=True
):
    """What a notebook asks of the gate (docs/http-api.md, "POST /v1/query")."""

    sql: str
    dataset: str | None = None
    notebook: str | None = None
    # The budget asked: an ε (and δ), or an accuracy at confidence 1 - alpha.
    epsilon: float | None = None
    delta: float | None = None
    accuracy: float | None = None
    alpha: float | None = None
    # Shares of the query's ε: the bounding report's, the private choice of clip bounds'.
    bounding_report: float | None = None
    clip: float | None = None
    # Tighter contribution bounds for this query than the policy's.
    max_partitions: int | None = None
    max_rows_per_partition: int | None = None
    params: dict[str, Any] | None = None
    dry_run: bool = False
    fresh: bool = False
    version: Annotated[int, msgspec.Meta(ge=1)] = WIRE_VERSION

    def body(self) -> dict[str, Any]:
        """The JSON object sent: the fields asked, defaults left out."""
        return msgspec.to_builtins(self)


FIELDS = frozenset(Ask.__struct_fields__)
