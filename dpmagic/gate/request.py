"""What a query asks, from the request's body: its fields checked for form only (types,
ranges, the fields that go together), never its SQL, so that a malformed body is
refused (``InvalidBody``, nothing charged) before anything is analysed; the engine
(``engine.py``) takes the checked ``QueryRequest`` from here."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.failures import BadRequest, InvalidBody
from dpmagic.gate.sql.clip import ClipBounds, ClipMoved, ClipStage

MAX_NOTEBOOK_CHARS = 512
MIN_EPSILON = 1e-12


@dataclass(frozen=True)
class QueryRequest:
    sql: str
    dataset: str | None
    epsilon: float | None
    delta: float | None
    notebook: str
    dry_run: bool
    fresh: bool
    params: dict[str, object]
    accuracy: float | None = None
    alpha: float = REPORT_ALPHA
    # The share of the budget for the bounding report (``sql/bounding_report.py``), if any.
    bounding_report: float | None = None
    # Tighter contribution bounds the analyst chose for this query (never above the
    # policy's: ``tightened``), as BigQuery's ``max_groups_contributed`` does.
    max_partitions: int | None = None
    max_rows_per_partition: int | None = None
    # The share of the query's ε that chooses its sums' value bounds (``sql/clip.py``),
    # and, set by the engine for each of the two releases, which one this is.
    clip: float | None = None
    stage: ClipStage | None = None
    whole_epsilon: float | None = None  # a clipped query's ε, both releases together

    @property
    def label(self) -> str:
        """The SQL as the ledger and the history show it: a clipped query's first release
        says what it is."""
        if isinstance(self.stage, ClipBounds):
            return f"-- --clip: the value bounds of this query's sums\n{self.sql}"
        if isinstance(self.stage, ClipMoved):
            return f"-- --clip: how many values the clip moved\n{self.sql}"
        return self.sql

    @classmethod
    def from_body(cls, body: object) -> QueryRequest:
        """The request a parsed body asks for; `InvalidBody` (nothing charged) if the
        body's shape is wrong. Only the body's form is judged here, never its SQL."""
        if not isinstance(body, dict):
            raise InvalidBody("the request body must be a JSON object")
        unknown = set(body) - FIELDS
        if unknown:
            # Cut short: the name is the client's own text, echoed back.
            raise InvalidBody(f"unknown field {sorted(unknown)[0][:MAX_NOTEBOOK_CHARS]!r}")
        sql = body.get("sql")
        if not isinstance(sql, str):
            raise InvalidBody("`sql` must be a string")
        _unicode(sql, "the query text")
        notebook = _short(body.get("notebook") or "unnamed", "notebook")
        dataset = None if body.get("dataset") is None else _short(body["dataset"], "dataset")
        params = _params(body)
        accuracy, alpha, report, clip = _shares(body)
        for flag in ("dry_run", "fresh"):
            if not isinstance(body.get(flag, False), bool):
                raise InvalidBody(f"`{flag}` must be true or false")
        return cls(
            sql=sql,
            dataset=dataset,
            epsilon=_number(body, "epsilon"),
            delta=_number(body, "delta"),
            notebook=notebook,
            dry_run=_flag(body, "dry_run"),
            fresh=_flag(body, "fresh"),
            params=params,
            accuracy=accuracy,
            alpha=REPORT_ALPHA if alpha is None else alpha,
            bounding_report=report,
            max_partitions=_whole(body, "max_partitions"),
            max_rows_per_partition=_whole(body, "max_rows_per_partition"),
            clip=clip,
        )


FIELDS = frozenset(
    {
        "sql", "dataset", "epsilon", "delta", "notebook", "dry_run", "fresh", "params",
        "accuracy", "alpha", "bounding_report", "max_partitions", "max_rows_per_partition",
        "clip",
    }
)  # fmt: skip


def _unicode(text: object, what: str) -> None:
    """Refuse a text no UTF-8 holds: JSON's escapes can spell a lone surrogate
    ("\\ud800"), which would otherwise fail deep in the analysis or the ledger."""
    if not isinstance(text, str):
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidBody(
            f"{what} is not valid Unicode (a lone surrogate, "
            f"U+{ord(text[exc.start]):04X}, at character {exc.start + 1})"
        ) from None


def _short(value: object, key: str) -> str:
    """A short text field's value (``notebook``, ``dataset``), checked."""
    if not isinstance(value, str) or len(value) > MAX_NOTEBOOK_CHARS:
        raise InvalidBody(f"`{key}` must be a short string")
    _unicode(value, f"`{key}`")
    return value


def _params(body: dict) -> dict[str, object]:
    """The parameters' object, every text in it (names and values, nested lists and
    objects too, which the analysis refuses later) valid Unicode."""
    params = body.get("params") or {}
    if not isinstance(params, dict):
        raise InvalidBody("`params` must be an object")
    for name, value in params.items():
        _unicode(name, "a parameter's name")
        values = [value]
        while values:
            item = values.pop()
            if isinstance(item, dict):
                values.extend([*item, *item.values()])
            elif isinstance(item, list):
                values.extend(item)
            else:
                _unicode(item, f"parameter ${name}")
    return params


def _shares(body: dict) -> tuple[float | None, float | None, float | None, float | None]:
    """``accuracy``, ``alpha``, ``bounding_report`` and ``clip``, each in its range and
    only with the fields it goes with."""
    accuracy = _number(body, "accuracy")
    if accuracy == 0:
        raise InvalidBody("`accuracy` must be positive")
    alpha = _number(body, "alpha")
    if alpha is not None and not 0 < alpha < 1:
        raise InvalidBody("`alpha` must be between 0 and 1")
    if alpha is not None and accuracy is None:
        raise InvalidBody("`alpha` goes with `accuracy`")
    if accuracy is not None and body.get("epsilon") is not None:
        raise InvalidBody("ask with `epsilon` or with `accuracy`, not both")
    report = _number(body, "bounding_report")
    if report is not None and not 0 < report < 1:
        raise InvalidBody("`bounding_report` is a share of the budget, between 0 and 1")
    clip = _number(body, "clip")
    if clip is not None and not 0 < clip < 1:
        raise InvalidBody("`clip` is a share of the query's ε, between 0 and 1")
    if clip is not None and (accuracy is not None or report is not None):
        raise InvalidBody("`clip` goes with an ε, without `accuracy` or `bounding_report`")
    return accuracy, alpha, report, clip


def _number(body: dict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidBody(f"`{key}` must be a finite number")
    try:
        number = float(value)  # a big int overflows here, not later in the engine
    except OverflowError:
        raise InvalidBody(f"`{key}` must be a finite number") from None
    if not math.isfinite(number):
        raise InvalidBody(f"`{key}` must be a finite number")
    if number < 0 or (key == "epsilon" and number == 0):
        raise InvalidBody(f"`{key}` must be positive")
    if key == "epsilon" and number < MIN_EPSILON:
        # Split over measurements, a smaller ε can round to zero.
        raise InvalidBody(f"`epsilon` must be at least {MIN_EPSILON:g}")
    return number


def _whole(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidBody(f"`{key}` must be a whole number ≥ 1")
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"`{key}` must be true or false")
    return value
