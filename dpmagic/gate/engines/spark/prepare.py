"""Load-time preparation as a Spark job: the same prepared tables as DuckDB's.

``sql/ranks.py`` states the rule and its privacy argument; this module
carries it out with Spark's DataFrame API (not DuckDB SQL transpiled):

1. each declared column is cast to its declared type (``try_cast``: a value that
   is not one becomes NULL; a fraction cast to an integer is rounded first, as
   DuckDB rounds), clamped into its bounds, text cut to ``max_length``;
2. each private table's rows are ranked within their unit (``__dpmagic_rank``) in
   a *total* order on row contents: the keyed hash ``xxhash64(seed, row, copy)``,
   then the row itself, then ``copy``, the number of an identical row among its
   copies. An order that were only partial would let Spark's partitioning decide
   which rows a unit keeps, and the rows kept could then change between runs;
   under a total order they are a function of the unit's own rows and the seed
   alone, however the data is split, so the bound holds for any fixed seed (and
   ``tests/system/test_spark.py`` repartitions the data to show it);
3. each private table's rows carry, for every private table ``U``, their unit's
   count of rows there (``__dpmagic_rows_U``, at most ``load_cap``), counted from
   the same rows the ranks number;
4. the tables are written as Parquet under a folder named by the fingerprint of
   the sources and the policy (``engines/versions.fingerprint``), marked complete last,
   and reused by later starts while the fingerprint matches.

The prepared tables are a copy of the private data. Where the gate can see the
location (a local path, with ``master``), it must be a folder of the gate's own
user that no one else may enter (``private_root``: created ``0700``, refused
otherwise), and what Spark writes in it, with its own umask, is made ``0600``
(files) and ``0700`` (folders) once written and at every reuse (``restrict``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from dpmagic.gate.engines.ranking import (
    RANK,
    ROWS,
    bounded_by_units,
    linked_first,
    load_cap,
    not_null_broken,
)
from dpmagic.gate.engines.versions import fingerprint
from dpmagic.gate.failures import required
from dpmagic.gate.policy import DERIVED_UNIT, Column, Dataset, PolicyError, Table

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("dpmagic.gate")

SPARK_TYPES = {"int": "bigint", "float": "double", "str": "string", "bool": "boolean",
               "date": "date"}  # fmt: skip
# Part of every version's name: a change to how Spark prepares tables is a new version.
FORMAT = "spark-1"
COMPLETE = "_dpmagic_complete"  # written last: a folder without it is never reused
COPY = "__dpmagic_copy"


def prepared_tables(
    spark: SparkSession,
    dataset: Dataset,
    root: str,
    seed: int | None = None,
    *,
    remote: bool = False,
) -> dict[str, str]:
    """Each table's prepared Parquet location: reused when a complete version with the
    dataset's fingerprint exists under ``root``, else prepared anew (older versions
    in a local ``root`` are then deleted). Over Spark Connect (``remote``) ``root`` is
    on the server's storage: the gate asks Spark whether a version is complete and
    leaves older versions to the storage's retention."""
    folder = None if remote else _local(root)
    if folder is not None:
        private_root(folder)
    catalog = json.dumps(catalog_identity(spark, dataset), sort_keys=True)
    key = hashlib.sha256(f"{FORMAT}:{fingerprint(dataset)}:{catalog}".encode()).hexdigest()
    version = f"{root.rstrip('/')}/{dataset.name}.{key[:24]}"
    locations = {
        name: f"{version}/{name}"
        for name in dataset.tables
        if name in dataset.sources or name in dataset.catalog
    }
    if _complete(spark, version, remote):
        log.info("dataset %s: reusing its prepared tables on Spark", dataset.name)
        if folder is not None:
            restrict(folder / Path(version).name)
        return locations
    log.info("dataset %s: preparing its tables on Spark", dataset.name)
    prepare(spark, dataset, locations, seed)
    spark.createDataFrame([(1,)], "done int").write.mode("overwrite").parquet(
        f"{version}/{COMPLETE}"
    )
    if folder is not None:
        restrict(folder / Path(version).name)
    if not remote:
        _delete_others(root, Path(version).name, dataset.name)
    return locations


def private_root(folder: Path) -> None:
    """Make sure the local folder Spark's prepared tables go in is the gate's alone:
    created ``0700`` if it is missing; refused (`PolicyError`, naming it) if it is
    not a folder, belongs to another user, or gives its group or others any access."""
    try:
        folder.mkdir(mode=0o700, parents=True)
        folder.chmod(0o700)  # whatever the umask
    except FileExistsError:
        pass
    except OSError as exc:
        raise PolicyError(f"Spark's prepared location {folder}: {exc.strerror}") from None
    if not folder.is_dir():
        raise PolicyError(f"Spark's prepared location {folder} is not a folder")
    copy = "it would hold a copy of the private data"
    st = folder.stat()
    if st.st_uid != os.geteuid():
        raise PolicyError(
            f"Spark's prepared location {folder} belongs to uid {st.st_uid}, not to the "
            f"gate's user (uid {os.geteuid()}): {copy}; use a folder of the gate's own"
        )
    if st.st_mode & 0o077:
        raise PolicyError(
            f"Spark's prepared location {folder} is open to others (mode "
            f"{st.st_mode & 0o777:04o}): {copy}; chmod 700 {folder}"
        )


def restrict(folder: Path) -> None:
    """Folders ``0700`` and files ``0600`` under ``folder``, ``folder`` included: Spark
    writes with its own umask (``0755`` and ``0644``)."""
    for where, _, names in os.walk(folder):
        paths = [(Path(where), 0o700), *((Path(where) / n, 0o600) for n in names)]
        for path, mode in paths:
            if path.is_symlink():
                continue
            try:
                path.chmod(mode)
            except OSError as exc:
                raise PolicyError(
                    f"cannot make {path} private ({mode:04o}): {exc.strerror}; Spark must "
                    "write the prepared location as the gate's user"
                ) from None


def prepare(
    spark: SparkSession, dataset: Dataset, locations: dict[str, str], seed: int | None = None
) -> None:
    """Write every table of ``locations`` as prepared (see the module's docstring)."""
    from pyspark.sql import functions as F

    seed = secrets.randbits(62) if seed is None else seed
    frames: dict[str, DataFrame] = {}
    for name in linked_first(dataset, locations):
        source = _source(spark, dataset, name)
        if dataset.tables[name].via is not None:
            source = _along_link(source, dataset, name, frames)
        frames[name] = prepared_frame(source, dataset, dataset.tables[name], seed)

    for name, frame in frames.items():
        for col in dataset.tables[name].columns.values():
            if col.not_null and frame.filter(F.col(col.name).isNull()).limit(1).count():
                raise PolicyError(not_null_broken(name, col.name))
    counted = [n for n in frames if bounded_by_units(dataset, dataset.tables[n])]
    counts = {n: _unit_counts(frames[n], dataset, dataset.tables[n]) for n in counted}
    for name, prepared in frames.items():
        if name in counted:
            prepared = _with_counts(prepared, dataset.tables[name], counts)
        prepared.write.mode("overwrite").parquet(locations[name])


def _along_link(
    source: DataFrame, dataset: Dataset, name: str, frames: dict[str, DataFrame]
) -> DataFrame:
    """``source`` with each row's unit read along its table's link (``Table.via``), as
    DuckDB's preparation reads it (``ranking._along_link``): the unit of the prepared
    linked row whose key the row names, NULL where none does; a key that is not
    unique refuses the start, naming the table and the column and no value."""
    from pyspark.sql import functions as F

    table = dataset.tables[name]
    via = required(table.via, "the link a derived unit is read along")
    if via.table not in frames:
        raise PolicyError(f"{name}.{via.column} links to {via.table!r}, which is not in the data")
    linked = frames[via.table]
    unit = required(dataset.tables[via.table].unit, "a linked table's unit")
    keyed = linked.where(F.col(via.key).isNotNull())
    if keyed.groupBy(via.key).count().where(F.col("count") > 1).limit(1).count():
        raise PolicyError(
            f"{name}.{via.column} links to {via.table}.{via.key}, but that column is not a "
            "key: some of its values name several rows (fix the data, or link another column)"
        )
    own = stored_column(_raw(source, via.column), table.columns[via.column], source)
    keys = keyed.select(F.col(via.key).alias("__key"), F.col(unit).alias(DERIVED_UNIT))
    return source.join(keys, own == keys["__key"], "left").drop("__key")


def _source(spark: SparkSession, dataset: Dataset, name: str) -> DataFrame:
    if name in dataset.catalog:
        return spark.table(dataset.catalog[name])
    return read(spark, dataset.sources[name])


def catalog_identity(spark: SparkSession, dataset: Dataset) -> dict[str, list[object]]:
    """What identifies a catalog table's contents without reading them: its files
    (each write of a Parquet or Delta table adds files of new names), with size and
    modification time where they are local."""
    identity: dict[str, list[object]] = {}
    for table, name in sorted(dataset.catalog.items()):
        files: list[object] = []
        for uri in sorted(spark.table(name).inputFiles()):
            local = _local(uri)
            if local is not None and local.exists():
                st = local.stat()
                files.append([uri, st.st_size, st.st_mtime_ns])
            else:
                files.append(uri)
        identity[table] = [name, *files]
    return identity


def read(spark: SparkSession, source: Path) -> DataFrame:
    """A source as DuckDB's load reads it: Parquet (a file or a folder of files), else
    CSV with a header and inferred types."""
    path = str(source)
    if source.is_dir() or source.suffix.lower() == ".parquet":
        return spark.read.option("recursiveFileLookup", "true").parquet(path)
    return spark.read.option("header", "true").option("inferSchema", "true").csv(path)


def prepared_frame(source: DataFrame, dataset: Dataset, table: Table, seed: int) -> DataFrame:
    """``source`` as prepared: declared columns stored, and for a private table with a
    unit, its rows ranked per unit in the total order above; rows without a unit
    (NULL, or not of the unit's type) are dropped."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not table.columns:
        return source
    raw = {c.name: _raw(source, c.name) for c in table.columns.values()}
    stored = [stored_column(raw[c.name], c, source).alias(c.name) for c in table.columns.values()]
    if not bounded_by_units(dataset, table):
        return source.select(*stored)
    unit = required(table.unit_column, "a private table's unit")
    key = typed(_raw(source, unit.name), unit, source)  # as DuckDB's: cast, not clamped
    if table.via is not None:  # read along the link (``_along_link``), already typed
        stored.append(key.alias(DERIVED_UNIT))
    content = [source[c] for c in source.columns]  # the whole source row, as DuckDB's
    copies = Window.partitionBy(*content).orderBy(*content)
    numbered = source.where(key.isNotNull()).withColumn(COPY, F.row_number().over(copies))
    row = [numbered[c] for c in source.columns]
    order = [F.xxhash64(F.lit(seed), *row, numbered[COPY]), *row, numbered[COPY]]
    ranked = F.row_number().over(Window.partitionBy(key).orderBy(*order))
    return numbered.select(*stored, ranked.alias(RANK))


def typed(raw: SparkColumn, col: Column, source: DataFrame) -> SparkColumn:
    """``raw`` cast to the column's declared type, NULL where it is not one. A fraction
    cast to an integer is rounded first: DuckDB's cast of 2.5 gives 3, Spark's 2."""
    from pyspark.sql import functions as F

    if col.type == "int" and _fractional(source, col.name):
        raw = F.round(raw)
    return raw.try_cast(SPARK_TYPES[col.type])


def stored_column(raw: SparkColumn, col: Column, source: DataFrame) -> SparkColumn:
    """A declared column as the gate stores it (``ranking.stored``, in Spark)."""
    from pyspark.sql import functions as F

    value = typed(raw, col, source)
    if col.max_length is not None:
        return F.substring(value, 1, col.max_length)
    if col.type in ("int", "float") and col.lower is not None and col.upper is not None:
        cast = int if col.type == "int" else float
        lo, hi = F.lit(cast(col.lower)), F.lit(cast(col.upper))
        if col.type == "float":
            lo, hi = lo.cast("double"), hi.cast("double")
        # NaN is above every number in Spark as in DuckDB: clamped to the upper bound.
        return F.when(value < lo, lo).when(value > hi, hi).otherwise(value)
    if col.dates is not None:
        lo, hi = (F.lit(d).cast("date") for d in col.dates)
        return F.when(value < lo, lo).when(value > hi, hi).otherwise(value)
    return value


def _raw(source: DataFrame, name: str) -> SparkColumn:
    """The source's column of that name, matched without regard to case as DuckDB's is."""
    from pyspark.sql import functions as F

    for c in source.columns:
        if c.lower() == name.lower():
            return source[c]
    return F.lit(None)  # a declared column the source lacks is all NULL


def _fractional(source: DataFrame, name: str) -> bool:
    for field in source.schema.fields:
        if field.name.lower() == name.lower():
            return field.dataType.typeName() in ("double", "float", "decimal")
    return False


def _unit_counts(prepared: DataFrame, dataset: Dataset, table: Table) -> DataFrame:
    """Each unit's rows in ``table``, at most ``load_cap``: its largest rank, counted over
    the stored unit as DuckDB's preparation counts it. (The ranking is computed again
    for this; the total order makes it the same ranking.)"""
    from pyspark.sql import functions as F

    unit = required(table.unit, "a private table's unit")
    return prepared.groupBy(prepared[unit].cast("string").alias("__u")).agg(
        F.least(F.max(RANK), F.lit(load_cap(dataset))).alias("__n")
    )


def _with_counts(prepared: DataFrame, table: Table, counts: dict[str, DataFrame]) -> DataFrame:
    """``prepared`` with its unit's count of rows in every counted table (0 if none).
    Units are matched as text, which also joins tables whose unit types differ, as
    DuckDB's preparation does."""
    from pyspark.sql import functions as F

    unit = required(table.unit, "a private table's unit")
    out = prepared
    for i, (other, frame) in enumerate(counts.items()):
        alias = f"__c{i}"
        joined = frame.select(F.col("__u").alias(alias + "u"), F.col("__n").alias(alias + "n"))
        out = out.join(joined, out[unit].cast("string") == joined[alias + "u"], "left")
        out = out.withColumn(ROWS + other, F.coalesce(F.col(alias + "n"), F.lit(0)).cast("bigint"))
        out = out.drop(alias + "u", alias + "n")
    return out


def _complete(spark: SparkSession, version: str, remote: bool) -> bool:
    local = None if remote else _local(version)
    if local is not None:
        return (local / COMPLETE).is_dir()
    try:
        spark.read.parquet(f"{version}/{COMPLETE}").count()
    except Exception:  # any failure to read the marker: not complete
        return False
    return True


def _delete_others(root: str, keep: str, dataset: str) -> None:
    """Delete older versions of the dataset's prepared tables in a local ``root`` (older
    copies of private data); on a cluster's storage, the owner's retention applies."""
    folder = _local(root)
    if folder is None:
        return
    for stale in folder.glob(f"{dataset}.*"):
        if stale.name != keep and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def _local(location: str) -> Path | None:
    """``location`` as a local path, or None for a cluster's storage (``hdfs://``, …)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(location) if parsed.scheme == "" else None
