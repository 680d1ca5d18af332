"""The parsed TOML of a policy into its typed values (``values.py``).

``schema.py`` checks each table's keys, types and ranges; what is left here are
the rules that link keys (a table's unit through its links, bounds in order, the
columns randomized response may cover, a Spark dataset's settings) and the
defaults that depend on other keys. Every error names the key's path.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpmagic.gate.policy.schema import (
    BudgetShape,
    ColumnShape,
    ConfValue,
    DatasetShape,
    GateShape,
    PolicyShape,
    ResponseShape,
    SparkShape,
    TableShape,
    decode,
)
from dpmagic.gate.policy.values import (
    CATALOG_PREFIX,
    DEFAULT_MAX_LENGTH,
    DEFAULT_MAX_TEXT_LENGTH,
    DERIVED_UNIT,
    MAX_UNIT_ROWS,
    VECTOR_ROWS,
    AccountantKind,
    Budget,
    Column,
    Dataset,
    EngineKind,
    GateConfig,
    Policy,
    PolicyError,
    RandomizedResponse,
    SparkConfig,
    Table,
    Via,
    row_work_limit,
)


def parse_policy(raw: dict, path: Path) -> Policy:
    """The policy whose parsed TOML is ``raw``; relative paths resolve against the
    folder of ``path``."""
    base = path.parent
    shape = decode(raw, PolicyShape, "")
    gate = _gate(shape.gate, base)
    if not shape.datasets:
        raise PolicyError("[datasets] declares no dataset")
    groups = _groups(shape.groups)
    datasets = {
        name: _dataset(name, decode(draw, DatasetShape, f"datasets.{name}"), base, gate)
        for name, draw in shape.datasets.items()
    }
    sessions = {
        (d.spark.master, d.spark.remote, d.spark.conf) for d in datasets.values() if d.spark
    }
    if len(sessions) > 1:
        # A process has one Spark session (its JVM's): every Spark dataset shares it.
        raise PolicyError("the Spark datasets of one gate must declare the same master or remote "
                          "and the same conf")  # fmt: skip
    check_workers(gate.workers, datasets.values())
    return Policy(path=path, gate=gate, datasets=datasets, groups=groups)


def check_workers(workers: int, datasets: Iterable[Dataset]) -> None:
    """Several worker processes serve DuckDB datasets only: each worker opens its own
    engine, and a Spark dataset's is a session (a JVM, a cluster's executors) that one
    process holds."""
    spark = sorted(d.name for d in datasets if d.engine == EngineKind.SPARK)
    if workers > 1 and spark:
        raise PolicyError(
            f"gate.workers = {workers} serves DuckDB datasets only; {spark[0]!r} runs on "
            "Spark: set workers = 1"
        )


def _groups(raw: dict[str, object]) -> dict[str, frozenset[str]]:
    """The ``[groups]`` table: each group's members, a list of user names. (On a
    JupyterHub a user's Hub groups join these, as the Hub reports them.)"""
    groups = {}
    for name, members in raw.items():
        if not name:
            raise PolicyError("groups: a group needs a name")
        if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
            raise PolicyError(
                f'groups.{name} must be a list of user names, such as ["alice", "bob"]'
            )
        groups[name] = frozenset(members)
    return groups


def _gate(shape: GateShape, base: Path) -> GateConfig:
    return GateConfig(
        listen=shape.listen or "unix:" + str(base / "gate.sock"),
        state_dir=_path(shape.state_dir, base),
        accountant=shape.accountant,
        tokens_file=_path(shape.tokens_file, base) if shape.tokens_file else None,
        response_quantum_ms=shape.response_quantum_ms,
        query_timeout_s=shape.query_timeout_s,
        memory_limit=shape.memory_limit,
        threads=shape.threads,
        workers=shape.workers,
    )


def _dataset(name: str, shape: DatasetShape, base: Path, gate: GateConfig) -> Dataset:
    where = f"datasets.{name}"
    default = gate.accountant
    engine, spark = _engine(shape, where)
    if (shape.database is None) == (not shape.sources):
        raise PolicyError(f"{where}: declare exactly one of `database` or `sources`")
    if shape.database is not None and engine == EngineKind.SPARK:
        raise PolicyError(
            f"{where}: `database` is a DuckDB file; a Spark dataset declares `sources` "
            "(Parquet files or folders, CSV files)"
        )
    unit = shape.privacy_unit.lower() if shape.privacy_unit else None
    tables = {
        tname.lower(): _table(tname, traw, f"{where}.tables.{tname}")
        for tname, traw in shape.tables.items()
    }
    if not tables:
        raise PolicyError(f"{where}: declare at least one table under [{where}.tables]")
    tables = _units(tables, unit, where)
    _randomized_tables(tables, where)
    sources = _sources(shape.sources, tables, engine, where)
    user_budget = _budget(shape.user_budget)
    notebook_budget = _budget(shape.notebook_budget) if shape.notebook_budget else user_budget
    dataset_budget = _budget(shape.dataset_budget) if shape.dataset_budget else None
    group_budgets = {
        group: _budget(decode(braw, BudgetShape, f"{where}.group_budgets.{group}"))
        for group, braw in shape.group_budgets.items()
    }
    accountant = shape.accountant or default
    limits = {"user_budget": user_budget, "notebook_budget": notebook_budget}
    if dataset_budget is not None:
        limits["dataset_budget"] = dataset_budget
    limits.update({f"group_budgets.{g}": b for g, b in group_budgets.items()})
    if accountant == AccountantKind.ZCDP and not all(b.delta for b in limits.values()):
        raise PolicyError(
            f"{where}: the zcdp accountant keeps budgets in (ε, δ); give "
            + ", ".join(k for k, b in limits.items() if not b.delta)
            + " a delta > 0"
        )
    if shape.query_default is not None and shape.query_default.renew is not None:
        raise PolicyError(f"{where}.query_default: a query's default ε does not renew")
    unit_rows = shape.max_partitions * shape.max_rows_per_partition
    if unit_rows > MAX_UNIT_ROWS:
        raise PolicyError(
            f"{where}: max_partitions × max_rows_per_partition is {unit_rows:,}"
            f"; at most {MAX_UNIT_ROWS:,} rows of one unit can be bounded"
        )
    return Dataset(
        name=name,
        database=_path(shape.database, base) if shape.database else None,
        sources={t: _path(s, base) for t, s in sources.items() if not s.startswith(CATALOG_PREFIX)},
        privacy_unit=unit,
        neighbouring=shape.neighbouring,
        max_partitions=shape.max_partitions,
        max_rows_per_partition=shape.max_rows_per_partition,
        user_budget=user_budget,
        notebook_budget=notebook_budget,
        query_default=_budget(shape.query_default) if shape.query_default else Budget(0.1),
        dataset_budget=dataset_budget,
        group_budgets=group_budgets,
        share_releases=shape.share_releases,
        public_tables_readable=shape.public_tables_readable,
        public_row_limit=shape.public_row_limit,
        tables=tables,
        accountant=accountant,
        group_size=shape.group_size,
        engine=engine,
        spark=spark,
        catalog={
            t: s.removeprefix(CATALOG_PREFIX)
            for t, s in sources.items()
            if s.startswith(CATALOG_PREFIX)
        },
        max_unit_work=shape.max_unit_work,
        max_row_work=_row_work(shape, gate, where),
        max_text_length=_text_cap(shape, tables, where),
        max_resource_failures=shape.max_resource_failures,
        load_rows=unit_rows,
    )


def _row_work(shape: DatasetShape, gate: GateConfig, where: str) -> int:
    """``max_row_work``: at most what keeps a vector of rows within its share of the
    gate's padding quantum (``row_work_limit``), so the owner may lower it only."""
    limit = row_work_limit(gate.response_quantum_ms)
    if shape.max_row_work is None:
        return limit
    if shape.max_row_work > limit:
        raise PolicyError(
            f"{where}.max_row_work ({shape.max_row_work:,}) is above {limit:,}, the most that "
            f"keeps a vector of {VECTOR_ROWS:,} rows within the gate's "
            "response_quantum_ms: lower it, or raise the quantum"
        )
    return shape.max_row_work


def _text_cap(shape: DatasetShape, tables: dict[str, Table], where: str) -> int:
    """``max_text_length``: the longest text a row expression may make; never shorter
    than a text column, which a query may read whole."""
    longest = max(
        (c.max_length or 0 for t in tables.values() for c in t.columns.values()), default=0
    )
    if shape.max_text_length is None:
        return max(DEFAULT_MAX_TEXT_LENGTH, longest)
    if shape.max_text_length < longest:
        raise PolicyError(
            f"{where}.max_text_length ({shape.max_text_length:,}) is shorter than a text "
            f"column's max_length ({longest:,})"
        )
    return shape.max_text_length


def _sources(
    raw: dict[str, Any], tables: dict[str, Table], engine: EngineKind, where: str
) -> dict[str, str]:
    """Each declared table's file, folder or (Spark only) ``table:NAME``, by table."""
    for tname, source in raw.items():
        if tname.lower() not in tables:
            raise PolicyError(f"{where}.sources.{tname}: no such table is declared")
        if not isinstance(source, str) or not source:
            raise PolicyError(f"{where}.sources.{tname} must be a file, a folder or table:NAME")
        if source.startswith(CATALOG_PREFIX) and engine != EngineKind.SPARK:
            raise PolicyError(
                f"{where}.sources.{tname}: {source!r} names a catalog table, which only a "
                'dataset with engine = "spark" reads'
            )
    return {t.lower(): s for t, s in raw.items()}


def _engine(shape: DatasetShape, where: str) -> tuple[EngineKind, SparkConfig | None]:
    """The dataset's ``engine`` and, for Spark, its ``spark`` table."""
    if shape.engine == EngineKind.DUCKDB:
        if shape.spark is not None:
            raise PolicyError(f'{where}.spark: only a dataset with engine = "spark" has one')
        return EngineKind.DUCKDB, None
    spark = shape.spark
    if spark is None:
        raise PolicyError(f'{where}.spark is required for engine = "spark", e.g. '
                          '{ master = "local[2]" }')  # fmt: skip
    if (spark.master is None) == (spark.remote is None):
        raise PolicyError(
            f"{where}.spark: declare exactly one of `master` (a session the gate starts, "
            'e.g. "local[2]") or `remote` (Spark Connect, e.g. "sc://host:15002")'
        )
    if spark.remote is not None and not spark.remote.startswith("sc://"):
        raise PolicyError(f"{where}.spark.remote must be a Spark Connect URL (sc://host:port)")
    if spark.remote is not None and spark.prepared is None:
        raise PolicyError(
            f"{where}.spark: a Spark Connect dataset names `prepared`, the folder or URI on "
            "the cluster's storage where the gate keeps its prepared tables (readable by the "
            "gate's principal only): the gate's state_dir is not the cluster's"
        )
    return EngineKind.SPARK, SparkConfig(
        spark.master, spark.remote, _conf(spark, where), spark.prepared
    )


def _conf(spark: SparkShape, where: str) -> tuple[tuple[str, str], ...]:
    """The session's settings as Spark reads them: text, booleans in lower case."""
    pairs = []
    for key, raw in spark.conf.items():
        # A union is a type to msgspec, not to mypy's ``type[T]``.
        value: ConfValue = decode(raw, ConfValue, f"{where}.spark.conf.{key}")  # type: ignore[arg-type]
        pairs.append((key, str(value).lower() if isinstance(value, bool) else str(value)))
    return tuple(sorted(pairs))


def _table(name: str, raw: object, where: str) -> Table:
    shape = decode(raw, TableShape, where)
    columns = {
        cname.lower(): _column(cname, craw, f"{where}.columns.{cname}")
        for cname, craw in shape.columns.items()
    }
    if not shape.public and not columns:
        raise PolicyError(f"{where}: a private table must declare its columns")
    unit = shape.unit
    if unit is not None and unit.lower() not in columns:
        raise PolicyError(f"{where}.unit must name one of the table's declared columns")
    for column, target in shape.links.items():
        if column.lower() not in columns:
            raise PolicyError(f"{where}.links: {column!r} is not a declared column")
        if not isinstance(target, str) or target.count(".") != 1:
            raise PolicyError(f'{where}.links.{column} must be "table.column"')
    if shape.public and (unit or shape.links):
        raise PolicyError(f"{where}: a public table has no privacy unit and no links")
    if shape.public and shape.max_rows_per_unit is not None:
        raise PolicyError(f"{where}.max_rows_per_unit: a public table has no units")
    return Table(
        name=name.lower(),
        public=shape.public,
        columns=columns,
        unit=unit.lower() if unit else None,
        links={c.lower(): t.lower() for c, t in shape.links.items()},
        max_rows=shape.max_rows_per_unit,
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
    for t in out.values():
        if len(t.links) > 1:
            raise PolicyError(
                f"{where}.tables.{t.name}.links: link one column, the one that leads to "
                "the person (other keys join as they are)"
            )
        for column, target in t.links.items():
            tname, tcol = target.split(".")
            other = out.get(tname)
            if other is None or other.public or tcol not in other.columns:
                raise PolicyError(
                    f"{where}.tables.{t.name}.links.{column}: {target!r} is not a column "
                    "of a declared private table"
                )
    # A link names another table's unit column (the linking column is then this
    # table's unit) or a key of a table that has a unit (each row's unit is then
    # read along the key when the gate prepares the data: ``Via``). A chain of links
    # (lineitem → orders → customer) settles in rounds, one table further each round.
    for _ in range(len(out)):
        for t in list(out.values()):
            if t.unit is not None or not t.links:
                continue
            ((column, target),) = t.links.items()
            tname, tcol = target.split(".")
            other = out[tname]
            found = other.unit_column
            if found is None:
                continue  # not settled yet
            if other.via is None and other.unit == tcol:
                out[t.name] = replace(t, unit=column)
                continue
            if t.columns[column].type != other.columns[tcol].type:
                raise PolicyError(
                    f"{where}.tables.{t.name}.links.{column}: {t.columns[column].type} "
                    f"cannot name a {other.columns[tcol].type} key ({target})"
                )
            via = Via(column=column, table=tname, key=tcol, unit_type=found.type)
            out[t.name] = replace(t, unit=DERIVED_UNIT, via=via)
    for t in out.values():
        for column, target in t.links.items():
            tname, tcol = target.split(".")
            if t.via is None and t.unit is not None and t.unit != column:
                raise PolicyError(
                    f"{where}.tables.{t.name}: its unit is {t.unit!r}, yet it links "
                    f"{column!r} to {target!r}: a table reaches its person one way"
                )
            if t.via is None and t.unit == column and out[tname].unit != tcol:
                raise PolicyError(
                    f"{where}.tables.{t.name}.links.{column}: {target!r} must be the privacy "
                    f"unit column of {tname!r}, as {column!r} is this table's"
                )
            if t.unit is None:
                raise PolicyError(
                    f"{where}.tables.{t.name}.links.{column}: {target!r} never reaches the "
                    f"privacy unit: {tname!r} must hold it or link to a table that does "
                    "(links must not go round in a circle)"
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


def _column(name: str, raw: object, where: str) -> Column:
    shape = decode(raw, ColumnShape, where, example='{ type = "int" }')
    column = _typed_column(name, shape, where)
    return replace(column, not_null=True) if shape.not_null else column


def _typed_column(name: str, shape: ColumnShape, where: str) -> Column:
    values = _public_values(shape, where)
    response = (
        _randomized_response(shape, shape.randomized_response, where)
        if shape.randomized_response
        else None
    )
    if shape.type == "str":
        return replace(_text_column(name, shape, values, where), randomized_response=response)
    if shape.max_length is not None:
        raise PolicyError(f"{where}.max_length applies to str columns only")
    if shape.type == "date":
        dates = _date_bounds(shape.lower, shape.upper, where)
        return Column(name=name.lower(), type="date", dates=dates, public_values=values)
    lower, upper = _numeric_bounds(shape, values, where)
    return Column(
        name=name.lower(),
        type=shape.type,
        lower=lower,
        upper=upper,
        public_values=values,
        randomized_response=response,
    )


def _numeric_bounds(
    shape: ColumnShape, values: tuple[object, ...] | None, where: str
) -> tuple[float | None, float | None]:
    """An int, float or bool column's bounds: as declared, else the range of its
    numeric public values (0 and 1 for a bool); whole numbers for an int column."""
    lower, upper = shape.lower, shape.upper
    for key, value in (("lower", lower), ("upper", upper)):
        if value is not None and not _is_number(value):
            raise PolicyError(f"{where}.{key} must be a finite number")
    if (lower is None) != (upper is None):
        raise PolicyError(f"{where}: declare both `lower` and `upper`, or neither")
    if lower is not None and lower > upper:
        raise PolicyError(f"{where}: lower ({lower}) is above upper ({upper})")
    if lower is not None and shape.type == "bool":
        raise PolicyError(f"{where}: bounds apply to int and float columns only")
    found = [v for v in values or () if isinstance(v, int | float) and _is_number(v)]
    if values and len(found) == len(values) and lower is None and shape.type != "bool":
        lower, upper = min(found), max(found)
    if shape.type == "bool" and lower is None:
        return 0, 1
    if shape.type == "int" and lower is not None:
        if lower != int(lower) or upper != int(upper):
            raise PolicyError(f"{where}: an int column needs whole-number bounds")
        return int(lower), int(upper)
    if shape.type == "float" and lower is not None:
        return float(lower), float(upper)
    return lower, upper


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _randomized_response(
    shape: ColumnShape, declared: ResponseShape, where: str
) -> RandomizedResponse:
    """``randomized_response = { p = … }``: the debiasing divides by ``p`` (in (0, 1],
    ``schema.py``) and spreads the other answers over ``public_values``, so a column
    needs at least two and no bounds of its own."""
    at = f"{where}.randomized_response"
    if shape.type == "date":
        raise PolicyError(f"{at}: applies to int, float, str and bool columns")
    if shape.public_values is None or len(shape.public_values) < 2:
        raise PolicyError(
            f"{at} needs public_values (at least two): the values a random answer was drawn from"
        )
    if shape.lower is not None or shape.upper is not None:
        raise PolicyError(
            f"{at}: the column's bounds are its public_values; remove lower and upper"
        )
    return RandomizedResponse(p=float(declared.p))


def _text_column(
    name: str, shape: ColumnShape, values: tuple[object, ...] | None, where: str
) -> Column:
    """A ``str`` column: its public values, and how many characters of each value are
    kept at load (``max_length``, at least the longest public value)."""
    if shape.lower is not None or shape.upper is not None:
        raise PolicyError(f"{where}: bounds apply to int and float columns only")
    longest = max((len(str(v)) for v in values or ()), default=0)
    length = shape.max_length or max(DEFAULT_MAX_LENGTH, longest)
    if length < longest:
        raise PolicyError(f"{where}.max_length ({length}) is shorter than a public value")
    return Column(name=name.lower(), type="str", public_values=values, max_length=length)


def _public_values(shape: ColumnShape, where: str) -> tuple[object, ...] | None:
    """The declared values, each one once; a value is a TOML scalar (a list or table
    cannot be a column's value)."""
    values = shape.public_values
    if values is None:
        return None
    for i, value in enumerate(values):
        if isinstance(value, list | dict):
            raise PolicyError(f"{where}.public_values[{i}] must be a single value")
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


def _budget(shape: BudgetShape) -> Budget:
    return Budget(epsilon=shape.epsilon, delta=shape.delta, renew=shape.renew)


def _path(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)
