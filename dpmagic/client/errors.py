"""Errors the notebook side raises for gate replies.

They live outside ``gate/`` because the kernel process needs them and must not
import the trusted side.
"""

from __future__ import annotations

from dpmagic.protocol import BudgetName


class DPError(Exception):
    """Any failure reported by the gate or on the way to it."""

    kind = "failed"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind


class QueryRefused(DPError):
    """The gate would not run the query; nothing was charged."""

    kind = "refused"


class BudgetExhausted(DPError):
    """The query costs more than the budget left; nothing was charged. ``budget`` is
    which budget, as the gate typed it (``protocol.BudgetName``: its kind, dataset,
    holder and notebook; None from an older gate)."""

    kind = "budget"
    budget: BudgetName | None = None

    def which(self) -> str:
        """The budget too small for the query, in a user's words, from the typed
        fields alone."""
        kind = None if self.budget is None else self.budget.budget
        holder = "" if self.budget is None else self.budget.holder or ""
        where = {
            "dataset": " in the dataset's budget, shared by all its users",
            "group": f" in the budget of your group {holder!r}",
            "user": " in your budget on this dataset",
            "notebook": " in this notebook's budget",
        }.get(str(kind), "")
        return f"not enough privacy budget{where}"


class AuthError(DPError):
    """The gate did not accept who we are."""

    kind = "auth"


class GateUnavailable(DPError):
    """No gate answered at the configured address."""

    kind = "unavailable"


class GateBusy(DPError):
    """The gate turned the connection away: this user already holds as many as one
    user may (or the gate is full). Nothing was read or charged; try again."""

    kind = "busy"


ERROR_KINDS: dict[str, type[DPError]] = {
    "refused": QueryRefused,
    "budget": BudgetExhausted,
    "auth": AuthError,
    "unavailable": GateUnavailable,
    "busy": GateBusy,
}
