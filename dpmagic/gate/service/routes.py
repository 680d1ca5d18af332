"""The HTTP API's endpoints (docs/http-api.md): what each route reads from the URL and
the body, and which of the engine's answers it returns."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from dpmagic.gate.engine import Engine
from dpmagic.gate.engines.interface import MAX_ROWS
from dpmagic.gate.failures import BadRequest
from dpmagic.gate.padding import PrivateRead
from dpmagic.gate.preview import DEFAULT_ROWS, PreviewRequest
from dpmagic.gate.reply import Reply
from dpmagic.gate.service.body import parse_body

# Entries of /v1/history: the newest ones, by default and at most.
HISTORY_DEFAULT = 100
HISTORY_MAX = 1000


class HTTPError(BadRequest):
    """A ``bad_request`` with its own HTTP status (400, 404, 405, 411, 413, 501)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _params(query: str, allowed: set[str]) -> dict[str, str]:
    """Single-valued query parameters; a typo is an error, not a silent default."""
    parsed = parse_qs(query, keep_blank_values=True)
    for name, values in parsed.items():
        if name not in allowed:
            raise HTTPError(400, f"unknown parameter {name!r}")
        if len(values) != 1:
            raise HTTPError(400, f"parameter {name!r} is given more than once")
    return {name: values[0] for name, values in parsed.items()}


def _query(engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead) -> Reply:
    _params(query, set())
    return engine.respond(user, parse_body(body), reads)


def _budget(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    params = _params(query, {"dataset", "notebook", "preview", "accuracy", "rows"})
    preview = _preview(params)
    return engine.budget(user, params.get("dataset"), params.get("notebook"), preview)


def _preview(params: dict[str, str]) -> PreviewRequest | None:
    """The utility preview asked for: ``preview=true``, with an ``accuracy`` (a positive
    number) and the ``rows`` a mean is over (a whole number) if given; either of them
    without ``preview=true`` is an error, not ignored."""
    flag = params.get("preview", "false")
    if flag not in ("true", "false"):
        raise HTTPError(400, "preview must be true or false")
    if flag == "false":
        if "accuracy" in params or "rows" in params:
            raise HTTPError(400, "accuracy and rows shape the preview: add preview=true")
        return None
    accuracy = None
    if "accuracy" in params:
        try:
            accuracy = float(params["accuracy"])
        except ValueError:
            accuracy = math.nan
        if not (math.isfinite(accuracy) and accuracy > 0):
            raise HTTPError(400, "accuracy must be a positive number")
    raw = params.get("rows", str(DEFAULT_ROWS))
    if not (re.fullmatch(r"[0-9]{1,20}", raw) and 1 <= int(raw) <= MAX_ROWS):
        raise HTTPError(400, f"rows must be a whole number from 1 to {MAX_ROWS}")
    return PreviewRequest(accuracy, int(raw))


def _history(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    params = _params(query, {"dataset", "notebook", "limit"})
    raw = params.get("limit", str(HISTORY_DEFAULT))
    if not raw.isdigit() or not 1 <= int(raw) <= HISTORY_MAX:
        raise HTTPError(400, f"limit must be a whole number from 1 to {HISTORY_MAX}")
    return engine.history(user, params.get("dataset"), params.get("notebook"), int(raw))


def _schema(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    return engine.schema(_params(query, {"dataset"}).get("dataset"))


def _health(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    return {"ok": True}


@dataclass(frozen=True)
class Route:
    """An endpoint. ``run`` gets the engine, the caller, the URL's query string, the
    body and the request's ``PrivateRead``, which only the engine's query run marks."""

    method: str
    authenticated: bool
    run: Callable[[Engine, str, str, bytes, PrivateRead], dict[str, object] | Reply]


ROUTES: dict[str, Route] = {
    "/v1/query": Route("POST", True, _query),
    "/v1/budget": Route("GET", True, _budget),
    "/v1/schema": Route("GET", True, _schema),
    "/v1/history": Route("GET", True, _history),
    "/v1/health": Route("GET", False, _health),
}
