"""What a query asks, from the request's body: its fields checked for form only (types,
ranges, the fields that go together), never its SQL, so that a malformed body is
refused (``InvalidBody``, nothing charged) before anything is analysed; the engine
(``engine.py``) takes the checked ``QueryRequest`` from here. What a request asks of its
dataset (its ε and δ, ``asked_budget``; its tighter bounds, ``tightened``) is here too,
read alike by the engine and by the queries of several releases
(``clip_releases.py``, ``staged_releases.py``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import msgspec

from dpmagic import protocol
from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.failures import BadRequest, InvalidBody
from dpmagic.gate.policy import AccountantKind, Dataset
from dpmagic.gate.sql.clip import ClipBounds, ClipMoved, Clipped, ClipStage
from dpmagic.protocol import FIELDS, WIRE_VERSION, Ask

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
        ask = _ask(body)
        _unicode(ask.sql, "the query text")
        notebook = _short(ask.notebook or "unnamed", "notebook")
        dataset = None if ask.dataset is None else _short(ask.dataset, "dataset")
        params = _params(ask.params or {})
        accuracy, alpha, report, clip = _shares(ask)
        return cls(
            sql=ask.sql,
            dataset=dataset,
            epsilon=_number(ask.epsilon, "epsilon"),
            delta=_number(ask.delta, "delta"),
            notebook=notebook,
            dry_run=ask.dry_run,
            fresh=ask.fresh,
            params=params,
            accuracy=accuracy,
            alpha=REPORT_ALPHA if alpha is None else alpha,
            bounding_report=report,
            max_partitions=_whole(ask.max_partitions, "max_partitions"),
            max_rows_per_partition=_whole(ask.max_rows_per_partition, "max_rows_per_partition"),
            clip=clip,
        )


# What each field must be, in the request's words, when its type is wrong.
_MUST = {
    "sql": "a string",
    "dataset": "a short string",
    "notebook": "a short string",
    "params": "an object",
    "dry_run": "true or false",
    "fresh": "true or false",
    "max_partitions": "a whole number ≥ 1",
    "max_rows_per_partition": "a whole number ≥ 1",
    "version": "a whole number ≥ 1",
} | {
    k: "a finite number"
    for k in ("epsilon", "delta", "accuracy", "alpha", "bounding_report", "clip")
}


def _ask(body: object) -> Ask:
    """The body as the wire's `Ask`; a wrong shape named by its field."""
    if not isinstance(body, dict):
        raise InvalidBody("the request body must be a JSON object")
    unknown = set(body) - FIELDS
    if unknown:
        # Cut short: the name is the client's own text, echoed back.
        raise InvalidBody(f"unknown field {sorted(unknown)[0][:MAX_NOTEBOOK_CHARS]!r}")
    try:
        ask = msgspec.convert(body, Ask)
    except msgspec.ValidationError as exc:
        field = re.search(r"at `\$\.(\w+)", str(exc)) or re.search(r"field `(\w+)`", str(exc))
        name = field[1] if field else "sql"
        raise InvalidBody(f"`{name}` must be {_MUST.get(name, 'well formed')}") from None
    if ask.version > WIRE_VERSION:
        raise InvalidBody(
            f"this gate reads query requests up to version {WIRE_VERSION}, not "
            f"{ask.version}: use a dpmagic client as old as the gate, or update the gate"
        )
    return ask


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


def _params(params: dict[str, object]) -> dict[str, object]:
    """The parameters' object, every text in it (names and values, nested lists and
    objects too, which the analysis refuses later) valid Unicode."""
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


def _shares(ask: Ask) -> tuple[float | None, float | None, float | None, float | None]:
    """``accuracy``, ``alpha``, ``bounding_report`` and ``clip``, each in its range and
    only with the fields it goes with."""
    accuracy = _number(ask.accuracy, "accuracy")
    if accuracy == 0:
        raise InvalidBody("`accuracy` must be positive")
    alpha = _number(ask.alpha, "alpha")
    if alpha is not None and not 0 < alpha < 1:
        raise InvalidBody("`alpha` must be between 0 and 1")
    if alpha is not None and accuracy is None:
        raise InvalidBody("`alpha` goes with `accuracy`")
    if accuracy is not None and ask.epsilon is not None:
        raise InvalidBody("ask with `epsilon` or with `accuracy`, not both")
    report = _number(ask.bounding_report, "bounding_report")
    if report is not None and not 0 < report < 1:
        raise InvalidBody("`bounding_report` is a share of the budget, between 0 and 1")
    clip = _number(ask.clip, "clip")
    if clip is not None and not 0 < clip < 1:
        raise InvalidBody("`clip` is a share of the query's ε, between 0 and 1")
    if clip is not None and (accuracy is not None or report is not None):
        raise InvalidBody("`clip` goes with an ε, without `accuracy` or `bounding_report`")
    return accuracy, alpha, report, clip


def _number(number: float | None, key: str) -> float | None:
    if number is None:
        return None
    if not math.isfinite(number):
        raise InvalidBody(f"`{key}` must be a finite number")
    if number < 0 or (key == "epsilon" and number == 0):
        raise InvalidBody(f"`{key}` must be positive")
    if key == "epsilon" and number < MIN_EPSILON:
        # Split over measurements, a smaller ε can round to zero.
        raise InvalidBody(f"`epsilon` must be at least {MIN_EPSILON:g}")
    return number


def _whole(value: int | None, key: str) -> int | None:
    if value is not None and value < 1:
        raise InvalidBody(f"`{key}` must be a whole number ≥ 1")
    return value


def default_delta(dataset: Dataset) -> float:
    """A query's δ when it names none (``protocol.default_delta``)."""
    return protocol.default_delta(
        dataset.query_default.delta,
        dataset.accountant == AccountantKind.ZCDP,
        dataset.notebook_budget.delta,
    )


def asked_budget(dataset: Dataset, request: QueryRequest) -> tuple[float, float]:
    """The (ε, δ) a query is asked at: the request's, else the policy's default."""
    epsilon = request.epsilon if request.epsilon is not None else dataset.query_default.epsilon
    return epsilon, request.delta if request.delta is not None else default_delta(dataset)


def tightened(dataset: Dataset, request: QueryRequest) -> Dataset:
    """``dataset`` with the contribution bounds the request chose, which may only be
    tighter than the policy's: a unit then brings fewer rows, the noise is smaller at
    the same ε, and more of the unit's rows are left out. The plan, its cost, the dry
    run and the replay key all read the tightened dataset, so nothing else needs to
    know. Above the policy's is refused, free, naming it."""
    asked = {
        "max_partitions": request.max_partitions,
        "max_rows_per_partition": request.max_rows_per_partition,
    }
    for key, value in asked.items():
        limit = getattr(dataset, key)
        if value is not None and value > limit:
            raise BadRequest(
                f"`{key}` may only tighten the policy's bound: at most {limit} here; "
                "nothing was charged"
            )
    partitions, rows = request.max_partitions, request.max_rows_per_partition
    stage = request.stage.clipped if isinstance(request.stage, ClipMoved) else request.stage
    chosen = stage.row_bound if isinstance(stage, Clipped) else None
    if chosen is not None:  # ``--clip``'s rows per person, within the bound it was chosen under
        rows = chosen if rows is None else min(rows, chosen)
    if partitions is None and rows is None:
        return dataset
    return replace(
        dataset,
        max_partitions=dataset.max_partitions if partitions is None else partitions,
        max_rows_per_partition=dataset.max_rows_per_partition if rows is None else rows,
    )
