"""The query wire, typed structs shared by the notebook's client and the gate.

``POST /v1/query`` carries an `Ask` as JSON. The client builds one from its keyword
arguments (``http_gate.Gate.query``, the offline ``transcript.TranscriptGate`` alike)
and the gate decodes the body into the same struct (``gate/request.py``), so each
field is spelled once, here, with its type. The gate still judges each value's
range and which fields go together, with messages in the request's own words; this
module only says what the fields are.

The reply is a `QueryReply`: the gate builds it (``gate/engine.py``,
``gate/reply.py``), the client decodes into it (``client/http_gate.py``,
``display/result.py``), and a mock run and a transcript build theirs with it too, so
a key the gate sends and the client reads is spelled once, here: every part of it
is a struct (the plan's entries, each output column's accuracy, the bounding
statement, ``--clip``'s choices, the budgets and the budget a refusal names), and
only the data's own values (rows, group keys, query parameters) and each column's
per-cell lists (numpy arrays in the gate, Arrow columns on the wire) are untyped.

msgspec, as for the policy file: its structs decode and check a body in one pass
without building an intermediate object per field, and forbid unknown fields.

This module runs in the gate and in the untrusted client alike: it imports nothing
from ``dpmagic.gate``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import replace

# The wire's version, of the request and of the reply: a gate refuses a newer request
# it cannot read, by name, rather than misreading a field whose meaning changed; a
# client reads a newer reply's fields it knows and leaves the rest. A body without
# one is version 1.
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


def default_delta(query_delta: float, zcdp: bool, notebook_delta: float) -> float:
    """A query's δ when it names none: the policy's default, and under zCDP (where δ
    only states a cost in (ε, δ)) the notebook budget's δ. Here, not in the gate, so
    that the transcript fills in the reply's ``request`` as the gate does and matches
    its stored answers without a copy of the rule."""
    if query_delta or not zcdp:
        return query_delta
    return notebook_delta


class _Fact(msgspec.Struct, kw_only=True):
    """A typed part of the reply. The gate makes each by its fields, so a key it adds
    without a field here fails where it is made; read, a part leaves keys it does not
    know (a newer gate's, an older ledger's) rather than refuse the whole reply. Sent,
    each field is there, unless its struct leaves out those at their default
    (``omit_defaults``: where a default says the fact is absent)."""

    def json(self) -> dict[str, Any]:
        """The part as a JSON object."""
        return msgspec.to_builtins(self)


class Cost(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a query charged (or, on a dry run, would charge); ``rho`` under zCDP.
    No defaults for ε and δ: a cost always says both, nothing spent too. Frozen, so
    that `FREE` can be every free reply's."""

    epsilon: float
    delta: float
    rho: float | None = None

    def __add__(self, other: Cost) -> Cost:
        """The cost of two releases together (sequential composition)."""
        rho = None
        if self.rho is not None or other.rho is not None:
            rho = (self.rho or 0.0) + (other.rho or 0.0)
        return Cost(epsilon=self.epsilon + other.epsilon, delta=self.delta + other.delta, rho=rho)


FREE = Cost(epsilon=0.0, delta=0.0)


class Asked(_Fact, omit_defaults=True):
    """The reply's ``request``: what was asked, the policy's defaults filled in. A
    transcript of released answers is matched on it where no gate can analyse."""

    sql: str = ""
    params: dict[str, Any] | None = None
    epsilon: float | None = None
    delta: float | None = None
    accuracy: float | None = None
    alpha: float | None = None
    bounding_report: float | None = None
    max_partitions: int | None = None
    max_rows_per_partition: int | None = None
    clip: float | None = None
    # Each release of a clipped query echoes what was asked; these mark the first two.
    clip_bounds: bool | None = None
    clip_moved: bool | None = None


class PartitionSelection(_Fact):
    """How the group keys of a query that reads them from the data were chosen (which
    keys appear is itself a DP output): a key is kept where its noisy count of
    privacy units, noised by ``mechanism`` at ``scale``, reaches ``threshold``; at a
    cost of ``epsilon`` and ``delta``."""

    mechanism: str
    scale: float
    threshold: int
    epsilon: float
    delta: float
    counts: str = "privacy units per key"


class PlanKey(_Fact, omit_defaults=True):
    """A group key as the plan states it: public (from the policy, with its number of
    ``values``) or private (chosen from the data), and where its values come from."""

    column: str
    public: bool
    source: str
    values: int | None = None


class Contribution(_Fact):
    """The contribution bounds in force: the groups one privacy unit may reach and the
    rows it may add to each."""

    groups: int
    rows: int


class Requested(_Fact):
    """An accuracy asked for: the ``half_width`` at ``alpha`` the plan delivers."""

    accuracy: float
    alpha: float
    half_width: float


class ErrorAt(_Fact, array_like=True):
    """An expected 95% half-width for a group of ``rows`` rows (``[rows, half_width]``)."""

    rows: int
    half_width: float


class Band(_Fact, array_like=True):
    """A band of a group's percentiles, as shares in [0, 1] (``[lower, upper]``)."""

    lower: float
    upper: float


class BandAt(_Fact, array_like=True):
    """A quantile's expected band of percentiles for a group of ``rows`` rows
    (``[rows, [lower, upper]]``)."""

    rows: int
    band: Band


class PlanStep(_Fact, omit_defaults=True):
    """One entry of a reply's ``plan`` (docs/http-api.md, "plan"), by its ``kind``: a
    noisy aggregate (``count``, ``sum`` …: its bounds, sensitivity and norm,
    mechanism, scale, cost, 95% half-width ``accuracy``, partitions, keys and
    contribution bounds, and ``requested`` with an accuracy asked), a quantile's
    selection (``quantile``; ``candidates``, ``level``, ``rank_radius``) and its
    interval's ends (``quantile_interval``), the noisy threshold that chooses private
    keys (``partition_selection``: its ``threshold``), or an output column
    (``output``: its ``column``, the ``rule`` its cells are judged by and its
    ``range``, its expected 95% error as ``half_width``, ``half_width_at`` or a
    quantile's ``percentiles_at`` and ``count``, and ``dominated_below``). A field
    that does not apply to a step is left out: a count has no ``bounds``, keys chosen
    from the data no ``partitions``, an output no size that says when noise
    dominates it no ``dominated_below``. Every figure is the gate's, from the query
    and the policy alone."""

    aggregate: str
    # Every entry says its kind; a stored reply of the first gates' has none.
    kind: str = ""
    bounds: list[float] | None = None
    sensitivity: float | None = None
    norm: str | None = None
    mechanism: str | None = None
    scale: float | None = None
    epsilon: float | None = None
    cost: Cost | None = None
    accuracy: float | None = None
    partitions: int | None = None
    keys: list[PlanKey] | None = None
    contribution: Contribution | None = None
    requested: Requested | None = None
    candidates: int | None = None
    level: float | None = None
    rank_radius: float | None = None
    threshold: int | None = None
    column: str | None = None
    rule: str | None = None
    range: list[float] | None = None
    half_width: float | None = None
    half_width_at: list[ErrorAt] | None = None
    percentiles_at: list[BandAt] | None = None
    count: str | None = None
    dominated_below: int | None = None


class RandomizedResponse(_Fact):
    """A debiased aggregate's randomization: each value kept with probability ``p``,
    else drawn among the column's ``values`` public values."""

    p: float
    values: int


class JudgedWider(_Fact):
    """The cells (row positions, ascending) flagged on a wider interval than the one
    shown: for each, that interval (None where the group may be empty) and the least
    group size it was judged at (None below one row)."""

    rows: list[int]
    intervals: list[list[float] | None]
    least_rows: list[float | None]


# A column's per-cell lists: pairs of ends and verdicts. In an Arrow reply each
# travels as fields of its own (``wire.py``), not in the envelope.
CELL_PAIRS = ("intervals", "percentiles")
CELL_VERDICTS = ("noise_dominates",)
CELL_FIELDS = (*CELL_PAIRS, *CELL_VERDICTS)


class ColumnAccuracy(_Fact, omit_defaults=True):
    """How one output column's cells are noised and judged: the mechanism and scale
    (of its one measurement; ``post-processing`` for an expression of several), the
    measurements it reads, the rule noise dominance is judged by (``zero``,
    ``range`` with its ``range``, or ``percentiles`` for a quantile, with the count
    its band is judged by), a bare quantile's ``level`` and ``rank_radius``, a
    debiased aggregate's randomization; then per cell its interval, a quantile's band
    of percentiles and the verdict on noise dominance (True, False, None where the
    gate cannot tell), with the cells flagged on a wider interval than the one shown.

    The per-cell lists are lists once read; in the gate they may be numpy arrays,
    which ``wire.split`` writes as Arrow columns (``Accuracy.carried``). A reply of an
    older gate may lack a verdict list: None, as the client reads it."""

    mechanism: str = "post-processing"
    scale: float | None = None
    measurements: list[str] = []
    rule: str | None = None
    range: list[float] | None = None
    count: str | None = None
    level: float | None = None
    rank_radius: float | None = None
    randomized_response: RandomizedResponse | None = None
    interval: str | None = None
    judged_wider: JudgedWider | None = None
    intervals: Any = None
    percentiles: Any = None
    noise_dominates: Any = None

    def without_cells(self) -> ColumnAccuracy:
        """The column's facts less its per-cell lists."""
        return replace(self, intervals=None, percentiles=None, noise_dominates=None)


class Accuracy(_Fact, omit_defaults=True):
    """``alpha`` and, per output column, how its cells are noised (None for a group
    key): its mechanism, scale, each cell's interval and verdict (``display/cells.py``)."""

    alpha: float
    columns: list[ColumnAccuracy | None]
    # The bounds every answer is over, in words (the bounding statement's ``text``).
    bounds: str | None = None
    # Which keys appear is itself a DP output: how they were chosen.
    partition_selection: PartitionSelection | None = None

    def carried(self) -> dict[str, Any]:
        """As a JSON object with each column's per-cell lists as they are: in the gate
        they may still be numpy arrays, which ``wire.split`` writes as Arrow columns
        rather than lists."""
        columns: list[dict[str, Any] | None] = []
        for column in self.columns:
            if column is None:
                columns.append(None)
                continue
            cells = {f: getattr(column, f) for f in CELL_FIELDS}
            facts = msgspec.to_builtins(column.without_cells())
            columns.append({**facts, **{f: v for f, v in cells.items() if v is not None}})
        return {**msgspec.to_builtins(replace(self, columns=[])), "columns": columns}


class Clamp(_Fact):
    """An aggregate's values clamped into ``bounds``."""

    aggregate: str
    bounds: list[float]


class NoisyCount(_Fact):
    """A noisy count and its interval, neither below 0."""

    value: float
    interval: list[float]


class LeftOut(_Fact, omit_defaults=True):
    """The bounding report: the rows the bounds left out, each unit's counted up to
    ``cap``, and the units they belong to, noisy; bought with ``share`` of the ε."""

    rows: NoisyCount
    units: NoisyCount
    cap: int
    share: float | None = None
    cost: Cost | None = None
    alpha: float | None = None
    text: str | None = None


class Bounding(_Fact):
    """The contribution bounds every answer is over, said from the plan before any data
    is read (a dry run too): rows per ``unit`` (or per unit and group, in so many
    groups), the clamps, a sentence; with the bounding report, ``left_out``."""

    unit: str | None = None
    rows_per_unit: int | None = None
    rows_per_group: int | None = None
    groups_per_unit: int | None = None
    clamps: list[Clamp] = []
    text: str = ""
    left_out: LeftOut | UnsetType = UNSET


class Exact(_Fact):
    """A plain read of public tables: exact, free; ``truncated`` at ``row_limit`` rows."""

    public_tables: bool = True
    row_limit: int | None = None
    truncated: bool = False


class PostProcessed(_Fact):
    """A query whose private reads were released first (``stages``) and whose rest was
    read plainly over them and ``public_tables``."""

    public_tables: list[str] = []
    row_limit: int | None = None
    truncated: bool = False


class Stage(_Fact, omit_defaults=True):
    """One release made before the query: its SQL and (ε, δ); after the run its one
    value and interval, or the rows it released into ``table``; whether it replayed."""

    sql: str
    epsilon: float
    delta: float
    replayed: bool | None = None
    # A subquery used as a value: the value (None: NULL) and its 95% interval (None:
    # unknown), both sent once released, both left out before (``UNSET``).
    value: float | UnsetType | None = UNSET
    interval: list[float] | UnsetType | None = UNSET
    # A subquery released as a table: its name and how many rows it released.
    rows: int | None = None
    table: str | None = None

    @property
    def released(self) -> bool:
        """Whether it ran (a dry run's stage only says what it will cost)."""
        return self.replayed is not None


class PerPerson(_Fact):
    """Where a per-person value lies (``bounds``), and why (``basis``)."""

    value: str
    bounds: list[Any]
    basis: str


class Moved(_Fact):
    """Per group, the noisy count of values ``--clip`` moved into the bounds it chose,
    and that count's 95% interval."""

    group: list[Any]
    count: float
    interval: list[float] | None = None


class ClipChoice(_Fact, omit_defaults=True):
    """``--clip``'s bounds for one summed argument: those used (``bounds``), whence
    (``source``: ``"data"`` or ``"declared"``) and why, what the rule read, what the
    cells hold and, where the data's were used, the values moved. A stage made without
    the rule has only ``aggregate`` and ``bounds``: the rest is None, left out."""

    aggregate: str
    bounds: list[float]
    source: str | None = None
    reason: str | None = None
    selected: list[float] | None = None
    declared: list[float] | None = None
    rank_error: float | None = None
    values: float | None = None
    values_low: float | None = None
    holds: str | None = None
    moved: list[Moved] | None = None


class ClipRows(_Fact):
    """``--clip``'s bound on the rows each person brings to a group: the one the query
    was asked with (``rows``), whence (``source``: ``"data"``, chosen at the persons'
    ``level`` quantile of their counts of rows, or ``"declared"``: the policy's, or the
    request's ``max_rows_per_partition``) and why, and the figures the rule read."""

    rows: int
    source: str
    reason: str
    selected: int
    declared: int
    level: float
    rank_error: float
    persons: float
    persons_low: float


class Clip(_Fact, omit_defaults=True):
    """What ``--clip`` decided: its ``share`` of the query's ε and the bounds' ε, the ε
    the counts of values moved took (None on a dry run, before anything is decided),
    the ``rule``, each argument's choice, the rows per person where the dataset has a
    unit, and whether every release was replayed."""

    share: float
    epsilon: float
    rule: str
    chosen: list[ClipChoice]
    moved_epsilon: float | None = None
    replayed: bool | None = None
    rows: ClipRows | None = None


class BudgetName(_Fact, omit_defaults=True):
    """A budget, as the HTTP API and the console name it: its kind (``user``,
    ``notebook``, ``dataset`` for all users together, ``group``), its dataset, and its
    holder (a user or a group) and notebook where it has them."""

    budget: str
    dataset: str
    holder: str | None = None
    notebook: str | None = None


class Renewal(_Fact):
    """A renewing budget's period (``day``, ``week``, ``month``) and when the next one
    begins (UTC, ISO 8601)."""

    period: str
    next: str


class Standing(_Fact, omit_defaults=True):
    """One budget as its dataset's accountant states it: spent, its limit (grants
    included) and what is left, in ε and δ (and ρ under zCDP). The notebook's
    ``remaining`` is what its next query may spend, the least left in any budget it
    draws on, and ``binding`` names the budget that least is in."""

    spent: Cost
    limit: Cost
    remaining: Cost
    renew: Renewal | None = None
    binding: BudgetName | None = None


class Budgets(_Fact, omit_defaults=True):
    """The budgets a user's queries on a dataset are charged against (a reply's
    ``budget``, and ``GET /v1/budget``): the user's and the notebook's always, the
    dataset's (all users together) and each of the user's groups' where the owner set
    one."""

    user: Standing | None = None
    notebook: Standing | None = None
    dataset_budget: Standing | None = None
    groups: dict[str, Standing] | None = None


class Shared(_Fact):
    """Another user's release of the same question, served: when and at what cost it
    was released, under which sharing, and the budgets serving it charged now."""

    released_at: str
    cost: Cost
    scope: str
    charged_to: list[BudgetName] = []


class Mock(_Fact):
    """A mock run: answered in the kernel on ``units`` fake privacy units."""

    units: int


class QueryReply(_Fact, forbid_unknown_fields=True, omit_defaults=False):
    """The reply to ``POST /v1/query`` (docs/http-api.md). ``rows`` and each column's
    per-cell lists travel as Arrow columns in an Arrow reply (``wire.py``); in a JSON
    reply, and here once read, they are in place. A key this version does not know is
    an error (``reply_of`` says when it is left out instead). Sent, a part the reply
    does not have (None) is left out; the rest, defaults too, are always there."""

    version: int = WIRE_VERSION
    dataset: str = ""
    engine: str | None = None
    columns: list[str] = []
    rows: Any = []  # lists of values; in the gate, a ``wire.Columns`` before it is sent
    cost: Cost = FREE
    plan: list[PlanStep] = []
    accuracy: Accuracy | None = None
    # The contribution bounds every answer is over, with the bounding report if bought.
    bounding: Bounding | None = None
    dry_run: bool = False
    replayed: bool = False
    request: Asked | None = None
    budget: Budgets = msgspec.field(default_factory=lambda: Budgets())
    exact: Exact | None = None
    post_processed: PostProcessed | None = None
    stages: list[Stage] | None = None
    per_person: list[PerPerson] | None = None
    clip: Clip | None = None
    shared: Shared | None = None
    # The same query released before over other data or policy facts: why it was
    # answered afresh.
    fresh_because: str | None = None
    mock: Mock | None = None
    # A transcript's dry run of a query it does not hold: no plan to show offline.
    offline: bool | None = None

    def json(self) -> dict[str, Any]:
        """The reply as a JSON object, the parts it does not have left out."""
        return {k: v for k, v in msgspec.to_builtins(self).items() if v is not None}


class Failure(_Fact, omit_defaults=True):
    """Why the gate answered no (a refusal, a bad request, a failure after the debit):
    its ``kind`` (``errors.ERROR_KINDS``), a message in words, and for an over-budget
    refusal which budget, typed (its kind, dataset and holder)."""

    kind: str
    message: str
    budget: BudgetName | None = None


class ErrorReply(_Fact):
    """The body of every 4xx and 5xx the gate sends, of any endpoint."""

    error: Failure


REPLY_FIELDS = frozenset(QueryReply.__struct_fields__)


def reply_of(data: dict[str, Any], *, migrate: bool = False) -> QueryReply:
    """``data``, a reply's JSON object, as a `QueryReply`; a body that is not one raises
    ``msgspec.ValidationError``. A reply of a newer version may carry fields this one
    does not know: they are left out. So are, with ``migrate``, those of a reply kept
    by an older gate (a ledger's, a transcript's), which is then of this version."""
    version = data.get("version")
    newer = isinstance(version, int) and version > WIRE_VERSION
    if newer or migrate:
        data = {k: v for k, v in data.items() if k in REPLY_FIELDS}
    reply = msgspec.convert(data, QueryReply)
    return replace(reply, version=WIRE_VERSION) if migrate else reply
