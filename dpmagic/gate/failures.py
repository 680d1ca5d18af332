"""Errors the gate answers with; each maps to one ``kind`` of the HTTP API.

A message must never carry a value read from private data: refusals are
decided before the data is touched, and failures after the debit are
reported with a fixed text.
"""

from __future__ import annotations

from typing import TypeVar

from dpmagic.protocol import BudgetName, ErrorReply, Failure

T = TypeVar("T")


class GateError(Exception):
    kind = "failed"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def as_reply(self) -> dict[str, object]:
        """The error's body (``protocol.ErrorReply``)."""
        return ErrorReply(error=self.failure()).json()

    def failure(self) -> Failure:
        return Failure(kind=self.kind, message=self.message)


class Refused(GateError):
    """The query is outside what the gate can answer privately."""

    kind = "refused"
    status = 400


class PublicOnly(Refused):
    """The query reads only public tables: the engine may read them plainly where the
    owner allows it (``public_reads.py``), else this refusal stands."""


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
    """A charge that does not fit a budget. ``budget`` names which, typed (its kind:
    dataset, group, user or notebook; its dataset and holder), for the client to say
    without reading the message."""

    kind = "budget"
    status = 403

    def __init__(self, message: str, budget: BudgetName | None = None) -> None:
        super().__init__(message)
        self.budget = budget

    def failure(self) -> Failure:
        return Failure(kind=self.kind, message=self.message, budget=self.budget)


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


class OwnerError(ValueError):
    """An owner's action (``gate/owner.py``: the CLI's budget commands, the console)
    that cannot be done; the message says why and what to do. Never sent to users."""
