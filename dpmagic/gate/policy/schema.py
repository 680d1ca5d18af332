"""The policy file's shape, as msgspec models: which keys each table has, their types,
their ranges and defaults. Unknown keys are refused (a misspelt key would otherwise
be a silently ignored bound).

msgspec rather than pydantic: both check a shape like this, but after the gate's own
imports msgspec adds about 2 ms to its start and pydantic 11 to 20 ms, then some 45 ms
more to build its first model. A model's error names its key path, except below a map keyed by
the owner's names (``datasets``, ``tables``, ``columns``, ``sources``...), where msgspec
writes ``[...]``: those maps are typed ``dict[str, Any]`` here and ``parsing.py``
decodes their entries one by one, each under its full path. Rules linking keys
(a table's unit, bounds in order, dates) are ``parsing.py``'s too.
"""

from __future__ import annotations

import re
import sys
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from dpmagic.gate.policy.values import (
    ACCOUNTANTS,
    COLUMN_TYPES,
    DEFAULT_MAX_RESOURCE_FAILURES,
    DEFAULT_MAX_UNIT_WORK,
    DEFAULT_PUBLIC_ROW_LIMIT,
    ENGINES,
    MAX_MAX_LENGTH,
    NEIGHBOURING,
    PERIODS,
    SHARINGS,
    AccountantKind,
    EngineKind,
    GateConfig,
    Neighbouring,
    Period,
    PolicyError,
    Sharing,
)

# Written as msgspec bounds, which take an int or a float but not the union of both: a
# number the owner wrote as ``30`` stays an int, as it always has.
_FINITE = sys.float_info.max
NonNegative = Annotated[int, msgspec.Meta(ge=0)] | Annotated[float, msgspec.Meta(ge=0, le=_FINITE)]
Below1 = Annotated[float, msgspec.Meta(ge=0, lt=1)]
Chance = Annotated[int, msgspec.Meta(gt=0, le=1)] | Annotated[float, msgspec.Meta(gt=0, le=1)]
Seconds = Annotated[int, msgspec.Meta(ge=1)] | Annotated[float, msgspec.Meta(ge=0.001, le=_FINITE)]
Whole = Annotated[int, msgspec.Meta(ge=1)]
Text = Annotated[str, msgspec.Meta(min_length=1)]
ConfValue = str | int | float | bool


class _Shape(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A TOML table whose keys are known: any other key is an error."""


class BudgetShape(_Shape, frozen=True):
    epsilon: NonNegative
    delta: Below1 = 0.0
    renew: Period | None = None


class ResponseShape(_Shape, frozen=True):
    p: Chance


class ColumnShape(_Shape, frozen=True):
    type: Literal["int", "float", "str", "bool", "date"]
    # A number or a date, as the column's type says: checked in ``parsing.py``.
    lower: Any = None
    upper: Any = None
    public_values: Annotated[list[Any], msgspec.Meta(min_length=1)] | None = None
    randomized_response: ResponseShape | None = None
    max_length: Annotated[int, msgspec.Meta(ge=1, le=MAX_MAX_LENGTH)] | None = None
    not_null: bool = False


class TableShape(_Shape, frozen=True):
    public: bool = False
    columns: dict[str, Any] = {}
    unit: str | None = None
    links: dict[str, Any] = {}
    max_rows_per_unit: Whole | None = None


class SparkShape(_Shape, frozen=True):
    master: Text | None = None
    remote: Text | None = None
    conf: dict[str, Any] = {}
    prepared: Text | None = None


class DatasetShape(_Shape, frozen=True):
    user_budget: BudgetShape
    tables: dict[str, Any]
    database: Text | None = None
    sources: dict[str, Any] = {}
    privacy_unit: str | None = None
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    max_partitions: Whole = 1
    max_rows_per_partition: Whole = 1
    max_unit_work: Whole = DEFAULT_MAX_UNIT_WORK
    max_row_work: Whole | None = None  # from the gate's padding quantum, unless set
    max_text_length: Whole | None = None  # DEFAULT_MAX_TEXT_LENGTH or the longest column's
    max_resource_failures: Whole = DEFAULT_MAX_RESOURCE_FAILURES
    notebook_budget: BudgetShape | None = None
    query_default: BudgetShape | None = None
    accountant: AccountantKind | None = None  # the gate's, unless set
    group_size: Whole = 1
    engine: EngineKind = EngineKind.DUCKDB
    spark: SparkShape | None = None
    dataset_budget: BudgetShape | None = None
    group_budgets: dict[str, Any] = {}
    share_releases: Sharing = Sharing.NONE
    public_tables_readable: bool = False
    public_row_limit: Whole = DEFAULT_PUBLIC_ROW_LIMIT


class GateShape(_Shape, frozen=True):
    """The ``[gate]`` table; its defaults are ``GateConfig``'s, stated once there."""

    listen: str | None = None  # a socket next to the policy file, unless set
    state_dir: str = "state"
    accountant: AccountantKind = GateConfig.accountant
    tokens_file: str | None = None
    response_quantum_ms: NonNegative = GateConfig.response_quantum_ms
    query_timeout_s: Seconds = GateConfig.query_timeout_s
    memory_limit: str = GateConfig.memory_limit
    threads: Whole = GateConfig.threads
    workers: Whole = GateConfig.workers


class PolicyShape(_Shape, frozen=True):
    datasets: dict[str, Any]
    gate: GateShape = msgspec.field(default_factory=GateShape)
    groups: dict[str, Any] = {}


_T = TypeVar("_T")


def decode(raw: object, shape: type[_T], where: str, example: str = "") -> _T:
    """``raw`` checked against ``shape``; an error is a :class:`PolicyError` naming the
    key's path below ``where`` (``""`` at the file's top), and ``example`` is shown when
    ``raw`` is not a TOML table."""
    try:
        return msgspec.convert(raw, shape)
    except msgspec.ValidationError as exc:
        raise PolicyError(_message(str(exc), where, example)) from None


# The words for msgspec's type names (a union's in sorted order, without null), and
# for the keys whose errors say more.
_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "float | int": "a number",
    "str": "a string",
    "bool": "true or false",
    "object": "a table",
    "array": "a list",
    "bool | float | int | str": "a string, number or boolean",
}
_CHOICES = {
    "accountant": ACCOUNTANTS,
    "neighbouring": NEIGHBOURING,
    "engine": ENGINES,
    "type": COLUMN_TYPES,
    "renew": PERIODS,
    "share_releases": SHARINGS,
}
_EXAMPLES = {
    "user_budget": "{ epsilon = 10.0 }",
    "dataset_budget": '{ epsilon = 50.0, renew = "month" }',
    "notebook_budget": "{ epsilon = 3.0 }",
    "query_default": "{ epsilon = 0.1 }",
    "randomized_response": "{ p = 0.75 }",
    "spark": '{ master = "local[2]" }',
}
# By the key's last two names: a column may be called ``p``.
_WHAT = {
    "randomized_response.p": "a number in (0, 1]: the chance a respondent reported their true value"
}
_RANGE = {">=": "at least", ">": "above", "<=": "at most", "<": "below"}


def _message(text: str, where: str, example: str) -> str:
    """msgspec's ``Expected `int` >= 1 - at `$.tables`...`` as ``datasets.d.… must be
    at least 1``: the key's path, then what it must be, in the policy's words."""
    text, _, at = text.partition(" - at `")
    path = where + at.rstrip("`").removeprefix("$")
    path = path.removeprefix(".")
    key = path.rsplit(".", 1)[-1]
    what = _WHAT.get(".".join(path.split(".")[-2:]))
    if found := re.fullmatch(r"Object contains unknown field `(.+)`", text):
        return f"{path or 'the policy'}: unknown key {found[1]!r}"
    if found := re.fullmatch(r"Object missing required field `(.+)`", text):
        missing, path = found[1], f"{path}.{found[1]}".removeprefix(".")
        if what := _WHAT.get(".".join(path.split(".")[-2:])):
            return f"{path} must be {what}"
        if missing in _CHOICES:
            return f"{path} is required: one of {', '.join(_CHOICES[missing])}"
        hint = _EXAMPLES.get(missing)
        return f"{path} is required" + (f", e.g. {hint}" if hint else "")
    if what:
        return f"{path} must be {what}"
    if text.startswith("Invalid enum value") and key in _CHOICES:
        return f"{path} must be one of {', '.join(_CHOICES[key])}"
    if found := re.fullmatch(r"Expected `(.+?)`, got `.+`", text):
        kinds = " | ".join(sorted(set(found[1].split(" | ")) - {"null"}))
        kind = _KINDS.get(kinds, f"`{found[1]}`")
        # At the top of ``raw`` (``at`` empty) the key is the owner's name: ``example``.
        hint = (_EXAMPLES.get(key, "") if at else example) if kind == "a table" else ""
        return f"{path} must be {kind}" + (f" such as {hint}" if hint else "")
    if found := re.fullmatch(r"Expected `(\w+)` (>=|>|<=|<) (\S+)", text):
        if float(found[3]) == _FINITE:
            return f"{path} must be a finite number"
        return f"{path} must be {_RANGE[found[2]]} {found[3]}"
    if found := re.fullmatch(r"Expected `(\w+)` of length >= 1", text):
        return f"{path} must be a non-empty {'string' if found[1] == 'str' else 'list'}"
    return f"{path}: {text}"
