"""Errors the gate answers with; each maps to one ``kind`` of the HTTP API.

A message must never carry a value read from private data: refusals are
decided before the data is touched, and failures after the debit are
reported with a fixed text.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class GateError(Exception):
    kind = "failed"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def as_reply(self) -> dict[str, dict[str, str]]:
        return {"error": {"kind": self.kind, "message": self.message}}


class Refused(GateError):
    """The query is outside what the gate can answer privately."""

    kind = "refused"
    status = 400


class BadRequest(GateError):
    kind = "bad_request"
    status = 400


class InvalidBody(BadRequest):
    """A malformed request body, refused before anything could be charged.

    The message says so: a client must never have to wonder whether a typo
    in its request cost budget.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; nothing was charged")


class Busy(GateError):
    """The caller already holds as many connections as one user may; nothing was read."""

    kind = "busy"
    status = 503


class OverBudget(GateError):
    kind = "budget"
    status = 403


class Unauthorized(GateError):
    kind = "auth"
    status = 401


class Failed(GateError):
    """Something went wrong after the debit; the text is fixed on purpose."""

    kind = "failed"
    status = 500

    def __init__(self, message: str = "the query failed after it was charged") -> None:
        super().__init__(message)


def required(value: T | None, what: str) -> T:
    """``value``, which the pass that made it guarantees is set here. A ``None`` is a
    bug of the gate's, raised as one even under ``python -O`` (an ``assert`` would
    vanish there); its message names the value, never data."""
    if value is None:
        raise RuntimeError(f"internal error: {what} is missing")
    return value
