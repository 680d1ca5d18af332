"""The data owner's policy: which tables exist, what is public, the bounds.

The policy file is the only source of facts the analysis passes may use.
Everything here is public by definition: it is written by the owner, shown to
users by ``/v1/schema``, and never derived from the data.
"""

from __future__ import annotations

import datetime as dt
import math
import tomllib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Literal

ColumnType = Literal["int", "float", "str", "bool", "date"]
COLUMN_TYPES: tuple[str, ...] = ("int", "float", "str", "bool", "date")
# Characters of a text value kept at load unless a column declares ``max_length``: the
# work any expression does on one row is then bounded, so one unit's rows cannot
# slow a query by much (SECURITY.md, per-unit work).
DEFAULT_MAX_LENGTH = 1024
MAX_MAX_LENGTH = 1_000_000
# ``max_partitions × max_rows_per_partition``, the most rows of one unit a query
# reads, is at most this: fewer than 2^40 units (``sql.plan.MAX_ROWS``) with this many
# rows each then fit a 64-bit count, and the exact sums' overflow proofs hold.
MAX_UNIT_ROWS = 2**22
# The most steps of work one unit may add to a query (``sql/work.py``), unless a dataset
# sets ``max_unit_work``: about 50 ms of DuckDB's time at the 3 ns a step measured
# (``benchmarks/per_unit_work.py``), well under the default padding quantum.
DEFAULT_MAX_UNIT_WORK = 2**24
# Queries of one user that may fail after the debit (out of time or memory) in a day,
# before the gate refuses that user's queries on the dataset (``engine._within_failures``).
DEFAULT_MAX_RESOURCE_FAILURES = 3


class AccountantKind(StrEnum):
    """How a dataset's spending composes (``accounting``): pure ε-DP, approximate
    (ε, δ)-DP, or zero-concentrated DP with Gaussian noise."""

    PURE = "pure"
    APPROX = "approx"
    ZCDP = "zcdp"


class Neighbouring(StrEnum):
    """Which datasets are neighbours: one unit added or removed, or one unit's rows
    replaced by any others."""

    ADD_REMOVE = "add_remove"
    SUBSTITUTE = "substitute"


class EngineKind(StrEnum):
    """What runs a dataset's generated SQL: DuckDB in the gate's process (one machine),
    or Apache Spark (a local session, a cluster or Spark Connect)."""

    DUCKDB = "duckdb"
    SPARK = "spark"


@dataclass(frozen=True)
class SparkConfig:
    """How the gate reaches Spark: ``master`` (``local[2]``, ``spark://host:7077``) for a
    session the gate starts, or ``remote`` (``sc://host:15002``) for Spark Connect;
    ``conf`` is passed to the session as it is (the gate's own settings win);
    ``prepared`` is where the prepared tables are written (a folder or URI only the
    gate's principal can read; default: ``spark/`` in the gate's state directory)."""

    master: str | None
    remote: str | None
    conf: tuple[tuple[str, str], ...] = ()
    prepared: str | None = None

    @property
    def where(self) -> str:
        """The master, or the Connect URL cut to its host and port: its parameters may
        hold a token, which neither the schema nor the gate's log repeats."""
        if self.master:
            return self.master
        return (self.remote or "").split(";", 1)[0].removesuffix("/")

    def as_dict(self) -> dict[str, object]:
        """The public part, for ``/v1/schema``: where Spark runs, not how it is set."""
        return {"master" if self.master else "remote": self.where}


CATALOG_PREFIX = "table:"  # a source read from Spark's catalog by name
ACCOUNTANTS: tuple[str, ...] = tuple(AccountantKind)
ENGINES: tuple[str, ...] = tuple(EngineKind)
NEIGHBOURING: tuple[str, ...] = tuple(Neighbouring)


class PolicyError(ValueError):
    """The policy file is malformed; the message names the key at fault."""


@dataclass(frozen=True)
class RandomizedResponse:
    """How a column's values were collected: each respondent reported their true
    value with probability ``p``, else one drawn uniformly from the column's
    ``public_values``. The gate debiases counts and means over such a column
    (see ``sql/randomized.py``); the data holds only the reported values."""

    p: float

    def as_dict(self) -> dict[str, float]:
        return {"p": self.p}


@dataclass(frozen=True)
class Budget:
    """A privacy amount in (ε, δ) terms: a limit, a spend or a default."""

    epsilon: float
    delta: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True)
class Column:
    """A column as the owner declared it; bounds and keys are public facts."""

    name: str
    type: ColumnType
    lower: float | None = None
    upper: float | None = None
    public_values: tuple[object, ...] | None = None
    dates: tuple[dt.date, dt.date] | None = None  # a date column's bounds
    randomized_response: RandomizedResponse | None = None
    max_length: int | None = None  # a text column's characters kept at load
    # A public table's column: the most rows sharing one stored value (read at start).
    repeats: int | None = None

    @property
    def bounded(self) -> bool:
        return self.lower is not None and self.upper is not None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"type": self.type}
        if self.lower is not None:
            out["lower"] = self.lower
        if self.upper is not None:
            out["upper"] = self.upper
        if self.public_values is not None:
            out["public_values"] = list(self.public_values)
        if self.dates is not None:
            out["lower"], out["upper"] = (d.isoformat() for d in self.dates)
        if self.randomized_response is not None:
            out["randomized_response"] = self.randomized_response.as_dict()
        if self.max_length is not None:
            out["max_length"] = self.max_length
        return out


@dataclass(frozen=True)
class Table:
    """A declared table. ``unit`` names the column holding the privacy unit
    (``None`` for public tables and row-level datasets); ``links`` maps a
    column to the ``table.column`` it references, as the owner declared."""

    name: str
    public: bool
    columns: dict[str, Column]
    unit: str | None = None
    links: dict[str, str] = field(default_factory=dict)
    rows: int | None = None  # a public table's rows, read at start (its contents are public)
    # A private table's most rows per unit, as the owner declares (1: a row per person).
    max_rows: int | None = None


@dataclass(frozen=True)
class Dataset:
    name: str
    database: Path | None
    sources: dict[str, Path]
    privacy_unit: str | None
    neighbouring: Neighbouring
    max_partitions: int
    max_rows_per_partition: int
    user_budget: Budget
    notebook_budget: Budget
    query_default: Budget
    tables: dict[str, Table]
    accountant: AccountantKind = AccountantKind.PURE
    group_size: int = 1
    engine: EngineKind = EngineKind.DUCKDB
    spark: SparkConfig | None = None
    # Spark only: tables read from the session's catalog by name (``"table:db.name"``).
    catalog: dict[str, str] = field(default_factory=dict)
    max_unit_work: int = DEFAULT_MAX_UNIT_WORK  # ``sql/work.py``
    max_resource_failures: int = DEFAULT_MAX_RESOURCE_FAILURES

    def table(self, name: str) -> Table | None:
        return self.tables.get(name.lower())

    def as_dict(self) -> dict[str, object]:
        """The public schema and policy facts served by ``/v1/schema``."""
        return {
            "dataset": self.name,
            "privacy_unit": self.privacy_unit,
            "neighbouring": self.neighbouring,
            "max_partitions": self.max_partitions,
            "max_rows_per_partition": self.max_rows_per_partition,
            "max_unit_work": self.max_unit_work,
            "max_resource_failures": self.max_resource_failures,
            "user_budget": self.user_budget.as_dict(),
            "notebook_budget": self.notebook_budget.as_dict(),
            "query_default": self.query_default.as_dict(),
            "accountant": self.accountant,
            "group_size": self.group_size,
            "engine": self.engine,
            **({"spark": self.spark.as_dict()} if self.spark else {}),
            "tables": {
                t.name: {
                    "public": t.public,
                    "columns": {c.name: c.as_dict() for c in t.columns.values()},
                    **({"unit": t.unit} if t.unit else {}),
                    **({"links": dict(t.links)} if t.links else {}),
                    **({"max_rows_per_unit": t.max_rows} if t.max_rows else {}),
                }
                for t in self.tables.values()
            },
        }


DEFAULT_QUANTUM_MS = 250.0


@dataclass(frozen=True)
class GateConfig:
    listen: str
    state_dir: Path
    accountant: AccountantKind = AccountantKind.PURE
    tokens_file: Path | None = None
    # Padding is on unless the owner turns it off (0): the default covers the gate's
    # own reply-time jitter for cheap queries (benchmarks/reply_jitter.py, docs/policy.md).
    response_quantum_ms: float = DEFAULT_QUANTUM_MS
    query_timeout_s: float = 30.0
    memory_limit: str = "2GB"
    threads: int = 2


@dataclass(frozen=True)
class Policy:
    path: Path
    gate: GateConfig
    datasets: dict[str, Dataset] = field(default_factory=dict)

    def dataset(self, name: str | None) -> Dataset:
        """The named dataset, or the only one when no name is given."""
        if name is None:
            if len(self.datasets) == 1:
                return next(iter(self.datasets.values()))
            raise PolicyError(
                "name a dataset: this gate serves " + ", ".join(sorted(self.datasets))
            )
        try:
            return self.datasets[name]
        except KeyError:
            raise PolicyError(
                f"unknown dataset {name!r}; this gate serves " + ", ".join(sorted(self.datasets))
            ) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy TOML file; relative paths are resolved
    against the file's folder so a policy can travel with its data."""
    path = Path(path).resolve()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path.name}: not valid TOML: {exc}") from None
    return parse_policy(raw, path)


def parse_policy(raw: dict, path: Path) -> Policy:
    base = path.parent
    gate_raw = _table(raw, "gate", "gate", required=False)
    gate = _gate(gate_raw, base)
    datasets_raw = _table(raw, "datasets", "datasets")
    if not datasets_raw:
        raise PolicyError("[datasets] declares no dataset")
    datasets = {
        name: _dataset(name, _table(datasets_raw, name, f"datasets.{name}"), base, gate.accountant)
        for name in datasets_raw
    }
    sessions = {
        (d.spark.master, d.spark.remote, d.spark.conf) for d in datasets.values() if d.spark
    }
    if len(sessions) > 1:
        # A process has one Spark session (its JVM's): every Spark dataset shares it.
        raise PolicyError("the Spark datasets of one gate must declare the same master or remote "
                          "and the same conf")  # fmt: skip
    return Policy(path=path, gate=gate, datasets=datasets)


def _gate(raw: dict, base: Path) -> GateConfig:
    _only(
        raw,
        "gate",
        {
            "listen",
            "state_dir",
            "accountant",
            "tokens_file",
            "response_quantum_ms",
            "query_timeout_s",
            "memory_limit",
            "threads",
        },
    )
    accountant = raw.get("accountant", "pure")
    if accountant not in ACCOUNTANTS:
        raise PolicyError(f"gate.accountant must be one of {', '.join(ACCOUNTANTS)}")
    accountant = AccountantKind(accountant)
    tokens = raw.get("tokens_file")
    return GateConfig(
        listen=str(raw.get("listen", "unix:" + str(base / "gate.sock"))),
        state_dir=_path(raw.get("state_dir", "state"), base),
        accountant=accountant,
        tokens_file=_path(tokens, base) if tokens else None,
        response_quantum_ms=_number(
            raw, "response_quantum_ms", "gate", DEFAULT_QUANTUM_MS, minimum=0.0
        ),
        query_timeout_s=_number(raw, "query_timeout_s", "gate", 30.0, minimum=0.001),
        memory_limit=str(raw.get("memory_limit", "2GB")),
        threads=int(_number(raw, "threads", "gate", 2, minimum=1)),
    )


def _dataset(
    name: str, raw: dict, base: Path, default_accountant: str = AccountantKind.PURE
) -> Dataset:
    where = f"datasets.{name}"
    _only(
        raw,
        where,
        {
            "database",
            "sources",
            "privacy_unit",
            "neighbouring",
            "max_partitions",
            "max_rows_per_partition",
            "max_unit_work",
            "max_resource_failures",
            "user_budget",
            "notebook_budget",
            "query_default",
            "tables",
            "accountant",
            "group_size",
            "engine",
            "spark",
        },
    )
    engine, spark = _engine(raw, where)
    database = raw.get("database")
    sources = raw.get("sources", {})
    if (database is None) == (not sources):
        raise PolicyError(f"{where}: declare exactly one of `database` or `sources`")
    if database is not None and engine == EngineKind.SPARK:
        raise PolicyError(
            f"{where}: `database` is a DuckDB file; a Spark dataset declares `sources` "
            "(Parquet files or folders, CSV files)"
        )
    neighbouring = raw.get("neighbouring", "add_remove")
    if neighbouring not in NEIGHBOURING:
        raise PolicyError(f"{where}.neighbouring must be one of {', '.join(NEIGHBOURING)}")
    neighbouring = Neighbouring(neighbouring)
    unit = raw.get("privacy_unit")
    tables = {
        tname.lower(): _table_decl(tname, traw, f"{where}.tables.{tname}")
        for tname, traw in _table(raw, "tables", where + ".tables").items()
    }
    if not tables:
        raise PolicyError(f"{where}: declare at least one table under [{where}.tables]")
    tables = _units(tables, unit.lower() if unit else None, where)
    _randomized_tables(tables, where)
    for tname, source in sources.items():
        if tname.lower() not in tables:
            raise PolicyError(f"{where}.sources.{tname}: no such table is declared")
        if not isinstance(source, str) or not source:
            raise PolicyError(f"{where}.sources.{tname} must be a file, a folder or table:NAME")
        if source.startswith(CATALOG_PREFIX) and engine != EngineKind.SPARK:
            raise PolicyError(
                f"{where}.sources.{tname}: {source!r} names a catalog table, which only a "
                'dataset with engine = "spark" reads'
            )
    catalog = {
        t.lower(): s.removeprefix(CATALOG_PREFIX)
        for t, s in sources.items()
        if s.startswith(CATALOG_PREFIX)
    }
    user_budget = _budget(raw, "user_budget", where, None)
    notebook_budget = _budget(raw, "notebook_budget", where, user_budget)
    accountant = raw.get("accountant", default_accountant)
    if accountant not in ACCOUNTANTS:
        raise PolicyError(f"{where}.accountant must be one of {', '.join(ACCOUNTANTS)}")
    accountant = AccountantKind(accountant)
    if accountant == AccountantKind.ZCDP and not (user_budget.delta and notebook_budget.delta):
        raise PolicyError(
            f"{where}: the zcdp accountant keeps budgets in (ε, δ); give user_budget and "
            "notebook_budget a delta > 0"
        )
    group_size = _number(raw, "group_size", where, 1, minimum=1)
    if group_size != int(group_size):
        raise PolicyError(f"{where}.group_size must be a whole number")
    max_partitions = int(_number(raw, "max_partitions", where, 1, minimum=1))
    max_rows = int(_number(raw, "max_rows_per_partition", where, 1, minimum=1))
    if max_partitions * max_rows > MAX_UNIT_ROWS:
        raise PolicyError(
            f"{where}: max_partitions × max_rows_per_partition is {max_partitions * max_rows:,}"
            f"; at most {MAX_UNIT_ROWS:,} rows of one unit can be bounded"
        )
    work = _number(raw, "max_unit_work", where, DEFAULT_MAX_UNIT_WORK, minimum=1)
    if work != int(work):
        raise PolicyError(f"{where}.max_unit_work must be a whole number")
    failures = _number(
        raw, "max_resource_failures", where, DEFAULT_MAX_RESOURCE_FAILURES, minimum=1
    )
    if failures != int(failures):
        raise PolicyError(f"{where}.max_resource_failures must be a whole number")
    return Dataset(
        name=name,
        database=_path(database, base) if database else None,
        sources={
            t.lower(): _path(p, base)
            for t, p in sources.items()
            if not p.startswith(CATALOG_PREFIX)
        },
        privacy_unit=unit.lower() if unit else None,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows_per_partition=max_rows,
        user_budget=user_budget,
        notebook_budget=notebook_budget,
        query_default=_budget(raw, "query_default", where, Budget(0.1)),
        tables=tables,
        accountant=accountant,
        group_size=int(group_size),
        engine=engine,
        spark=spark,
        catalog=catalog,
        max_unit_work=int(work),
        max_resource_failures=int(failures),
    )


def _engine(raw: dict, where: str) -> tuple[EngineKind, SparkConfig | None]:
    """The dataset's ``engine`` and, for Spark, its ``spark`` table."""
    engine = raw.get("engine", EngineKind.DUCKDB)
    if engine not in ENGINES:
        raise PolicyError(f"{where}.engine must be one of {', '.join(ENGINES)}")
    if engine == EngineKind.DUCKDB:
        if "spark" in raw:
            raise PolicyError(f'{where}.spark: only a dataset with engine = "spark" has one')
        return EngineKind.DUCKDB, None
    spark = _table(raw, "spark", where + ".spark")
    _only(spark, where + ".spark", {"master", "remote", "conf", "prepared"})
    master, remote = spark.get("master"), spark.get("remote")
    if (master is None) == (remote is None):
        raise PolicyError(
            f"{where}.spark: declare exactly one of `master` (a session the gate starts, "
            'e.g. "local[2]") or `remote` (Spark Connect, e.g. "sc://host:15002")'
        )
    for key in ("master", "remote", "prepared"):
        if key in spark and not (isinstance(spark[key], str) and spark[key]):
            raise PolicyError(f"{where}.spark.{key} must be a non-empty string")
    if remote is not None and not remote.startswith("sc://"):
        raise PolicyError(f"{where}.spark.remote must be a Spark Connect URL (sc://host:port)")
    if remote is not None and "prepared" not in spark:
        raise PolicyError(
            f"{where}.spark: a Spark Connect dataset names `prepared`, the folder or URI on "
            "the cluster's storage where the gate keeps its prepared tables (readable by the "
            "gate's principal only): the gate's state_dir is not the cluster's"
        )
    conf = _table(spark, "conf", where + ".spark.conf", required=False)
    for key, value in conf.items():
        if not isinstance(value, str | int | float | bool):
            raise PolicyError(f"{where}.spark.conf.{key} must be a string, number or boolean")
    pairs = tuple(sorted((k, str(v).lower() if isinstance(v, bool) else str(v))
                         for k, v in conf.items()))  # fmt: skip
    return EngineKind.SPARK, SparkConfig(master, remote, pairs, spark.get("prepared"))


def _table_decl(name: str, raw: dict, where: str) -> Table:
    _only(raw, where, {"public", "columns", "unit", "links", "max_rows_per_unit"})
    public = bool(raw.get("public", False))
    columns = {
        cname.lower(): _column(cname, craw, f"{where}.columns.{cname}")
        for cname, craw in _table(raw, "columns", where + ".columns", required=False).items()
    }
    if not public and not columns:
        raise PolicyError(f"{where}: a private table must declare its columns")
    unit = raw.get("unit")
    if unit is not None and (not isinstance(unit, str) or unit.lower() not in columns):
        raise PolicyError(f"{where}.unit must name one of the table's declared columns")
    links = _table(raw, "links", where + ".links", required=False)
    for column, target in links.items():
        if column.lower() not in columns:
            raise PolicyError(f"{where}.links: {column!r} is not a declared column")
        if not isinstance(target, str) or target.count(".") != 1:
            raise PolicyError(f'{where}.links.{column} must be "table.column"')
    if public and (unit or links):
        raise PolicyError(f"{where}: a public table has no privacy unit and no links")
    max_rows = None
    if "max_rows_per_unit" in raw:
        if public:
            raise PolicyError(f"{where}.max_rows_per_unit: a public table has no units")
        max_rows = raw["max_rows_per_unit"]
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1:
            raise PolicyError(f"{where}.max_rows_per_unit must be a whole number ≥ 1")
    return Table(
        name=name.lower(),
        public=public,
        columns=columns,
        unit=unit.lower() if unit else None,
        links={c.lower(): str(t).lower() for c, t in links.items()},
        max_rows=max_rows,
    )


def _units(tables: dict[str, Table], unit: str | None, where: str) -> dict[str, Table]:
    """Give each private table the column that holds its privacy unit.

    A table holds it under the dataset's ``privacy_unit`` name, under its own
    ``unit`` key, or in a column it ``links`` to another table's unit column
    (``visits.patient_id → patients.id``): each of its rows then belongs to
    the unit that column names.
    """
    out = dict(tables)
    for t in tables.values():
        if t.public or unit is None:
            if (t.unit or t.links) and unit is None:
                raise PolicyError(
                    f"{where}.tables.{t.name}: units and links need the dataset's privacy_unit"
                )
            continue
        if t.unit is None and unit in t.columns:
            out[t.name] = replace(t, unit=unit)
    # A link may point at a table whose own unit comes from a link: settle in rounds.
    for _ in range(len(out)):
        for t in list(out.values()):
            for column, target in t.links.items():
                tname, tcol = target.split(".")
                other = out.get(tname)
                if other is None or other.public or tcol not in other.columns:
                    raise PolicyError(
                        f"{where}.tables.{t.name}.links.{column}: {target!r} is not a column "
                        "of a declared private table"
                    )
                if other.unit == tcol and t.unit is None:
                    out[t.name] = t = replace(t, unit=column)
    for t in out.values():
        for column, target in t.links.items():
            tname, tcol = target.split(".")
            if out[tname].unit != tcol:
                raise PolicyError(
                    f"{where}.tables.{t.name}.links.{column}: {target!r} must be the privacy "
                    f"unit column of {tname!r}"
                )
            if t.unit != column:
                raise PolicyError(
                    f"{where}.tables.{t.name}: its unit is {t.unit!r}, yet it links "
                    f"{column!r} to the unit of {tname!r}"
                )
    for t in out.values():
        if not t.public and unit is not None and t.unit is None:
            raise PolicyError(
                f"{where}.tables.{t.name}: a private table must hold the privacy unit: a "
                f"column {unit!r}, a `unit` key, or a link to another table's unit"
            )
    return out


def _randomized_tables(tables: dict[str, Table], where: str) -> None:
    """Randomized response protects private answers: a public table's values are not
    answers, and a privacy unit column must hold the unit itself."""
    for t in tables.values():
        for c in t.columns.values():
            if c.randomized_response is None:
                continue
            at = f"{where}.tables.{t.name}.columns.{c.name}.randomized_response"
            if t.public:
                raise PolicyError(f"{at}: a public table's columns are not randomized answers")
            if c.name == t.unit or c.name in t.links:
                raise PolicyError(f"{at}: the privacy unit column cannot be randomized")


def _column(name: str, raw: dict, where: str) -> Column:
    if not isinstance(raw, dict):
        raise PolicyError(f'{where}: expected a table such as {{ type = "int" }}')
    _only(
        raw, where, {"type", "lower", "upper", "public_values", "randomized_response", "max_length"}
    )
    ctype = raw.get("type")
    if ctype not in COLUMN_TYPES:
        raise PolicyError(f"{where}.type must be one of {', '.join(COLUMN_TYPES)}")
    if ctype == "str":
        return _text_column(name, raw, where)
    if "max_length" in raw:
        raise PolicyError(f"{where}.max_length applies to str columns only")
    if "randomized_response" in raw:
        return replace(
            _column(name, {k: v for k, v in raw.items() if k != "randomized_response"}, where),
            randomized_response=_randomized_response(raw, where),
        )
    lower, upper = raw.get("lower"), raw.get("upper")
    if ctype == "date":
        return Column(
            name=name.lower(),
            type=ctype,
            dates=_date_bounds(lower, upper, where),
            public_values=_public_values(raw, where),
        )
    for key, value in (("lower", lower), ("upper", upper)):
        if value is not None and (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise PolicyError(f"{where}.{key} must be a finite number")
    if (lower is None) != (upper is None):
        raise PolicyError(f"{where}: declare both `lower` and `upper`, or neither")
    if lower is not None and lower > upper:
        raise PolicyError(f"{where}: lower ({lower}) is above upper ({upper})")
    if lower is not None and ctype not in ("int", "float"):
        raise PolicyError(f"{where}: bounds apply to int and float columns only")
    values = _public_values(raw, where)
    if (
        values is not None
        and lower is None
        and ctype in ("int", "float")
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    ):
        lower, upper = min(values), max(values)
    if ctype == "bool" and lower is None:
        lower, upper = 0, 1
    if ctype == "int" and lower is not None:
        if lower != int(lower) or upper != int(upper):
            raise PolicyError(f"{where}: an int column needs whole-number bounds")
        lower, upper = int(lower), int(upper)
    if ctype == "float" and lower is not None:
        lower, upper = float(lower), float(upper)
    return Column(name=name.lower(), type=ctype, lower=lower, upper=upper, public_values=values)


def _randomized_response(raw: dict, where: str) -> RandomizedResponse:
    """Validate ``randomized_response = { p = … }``: the debiasing divides by ``p`` and
    spreads the other answers over ``public_values``, so both must be sound."""
    where_rr = f"{where}.randomized_response"
    spec = raw["randomized_response"]
    if not isinstance(spec, dict):
        raise PolicyError(f"{where_rr} must be a table such as {{ p = 0.75 }}")
    _only(spec, where_rr, {"p"})
    p = spec.get("p")
    if not isinstance(p, int | float) or isinstance(p, bool) or not 0 < p <= 1:
        raise PolicyError(
            f"{where_rr}.p must be a number in (0, 1]: the chance a respondent reported "
            "their true value"
        )
    if raw.get("type") == "date":
        raise PolicyError(f"{where_rr}: applies to int, float, str and bool columns")
    values = raw.get("public_values")
    if not isinstance(values, list) or len(values) < 2:
        raise PolicyError(
            f"{where_rr} needs public_values (at least two): the values a random answer "
            "was drawn from"
        )
    if "lower" in raw or "upper" in raw:
        raise PolicyError(
            f"{where_rr}: the column's bounds are its public_values; remove lower and upper"
        )
    return RandomizedResponse(p=float(p))


def _text_column(name: str, raw: dict, where: str) -> Column:
    """A ``str`` column: its public values, and how many characters of each value are
    kept at load (``max_length``, at least the longest public value)."""
    if raw.get("lower") is not None or raw.get("upper") is not None:
        raise PolicyError(f"{where}: bounds apply to int and float columns only")
    values = _public_values(raw, where)
    longest = max((len(str(v)) for v in values or ()), default=0)
    length = raw.get("max_length", max(DEFAULT_MAX_LENGTH, longest))
    if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= MAX_MAX_LENGTH:
        raise PolicyError(f"{where}.max_length must be a whole number from 1 to {MAX_MAX_LENGTH:,}")
    if length < longest:
        raise PolicyError(f"{where}.max_length ({length}) is shorter than a public value")
    column = Column(name=name.lower(), type="str", public_values=values, max_length=length)
    if "randomized_response" in raw:
        return replace(column, randomized_response=_randomized_response(raw, where))
    return column


def _public_values(raw: dict, where: str) -> tuple[object, ...] | None:
    values = raw.get("public_values")
    if values is None:
        return None
    if not isinstance(values, list) or not values:
        raise PolicyError(f"{where}.public_values must be a non-empty list")
    if len(set(values)) != len(values):
        raise PolicyError(f"{where}.public_values has duplicates")
    return tuple(values)


def _date_bounds(lower: object, upper: object, where: str) -> tuple[dt.date, dt.date] | None:
    """A date column's bounds: TOML dates (``2019-01-01``) or ISO strings."""
    if lower is None and upper is None:
        return None
    out = []
    for key, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, dt.datetime):
            value = value.date()
        if isinstance(value, str):
            try:
                value = dt.date.fromisoformat(value)
            except ValueError:
                value = None
        if not isinstance(value, dt.date):
            raise PolicyError(f"{where}.{key} must be a date such as 2019-01-01")
        out.append(value)
    if out[0] > out[1]:
        raise PolicyError(f"{where}: lower ({out[0]}) is above upper ({out[1]})")
    return out[0], out[1]


def _budget(raw: dict, key: str, where: str, default: Budget | None) -> Budget:
    value = raw.get(key)
    if value is None:
        if default is None:
            raise PolicyError(f"{where}.{key} is required, e.g. {{ epsilon = 10.0 }}")
        return default
    if not isinstance(value, dict):
        raise PolicyError(f"{where}.{key} must be a table such as {{ epsilon = 1.0 }}")
    _only(value, f"{where}.{key}", {"epsilon", "delta"})
    eps = _number(value, "epsilon", f"{where}.{key}", None, minimum=0.0)
    delta = _number(value, "delta", f"{where}.{key}", 0.0, minimum=0.0)
    if delta >= 1:
        raise PolicyError(f"{where}.{key}.delta must be below 1")
    return Budget(epsilon=eps, delta=delta)


def _table(raw: dict, key: str, where: str, *, required: bool = True) -> dict:
    value = raw.get(key)
    if value is None:
        if required:
            raise PolicyError(f"[{where}] is missing")
        return {}
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be a table")
    return value


def _number(raw: dict, key: str, where: str, default, *, minimum: float) -> float:
    value = raw.get(key, default)
    if value is None:
        raise PolicyError(f"{where}.{key} is required")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise PolicyError(f"{where}.{key} must be a finite number")
    if value < minimum:
        raise PolicyError(f"{where}.{key} must be at least {minimum}")
    return value


def _only(raw: dict, where: str, allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r}")


def _path(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)
