"""The gate's Spark session: one per gate process, settings pinned.

A Python process has one Spark driver (its JVM), so every Spark dataset of a gate
shares one session (the policy requires the same ``master``/``remote`` and
``conf``). The gate's own settings are applied after the owner's ``conf`` and win:

* ``spark.sql.ansi.enabled = true``: arithmetic that overflows raises instead of
  wrapping around silently. Every row expression the gate runs is proven unable
  to raise (``sql/engine_rows.py``), so ANSI mode never fails a query on data;
  it makes a gate bug loud instead of a wrong answer.
* ``spark.sql.runSQLOnFiles = false``: no ``parquet.`/path``` table can name a file.
* ``spark.sql.session.timeZone = UTC``: dates read and compared the same everywhere.
* ``spark.ui.enabled = false``: the web UI would show plans and query text.

Over Spark Connect the first three are set on every session the gate opens and
read back; the UI is the server's, configured by its owner (``docs/spark.md``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from dpmagic.gate.failures import required
from dpmagic.gate.policy import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("dpmagic.gate")

PINNED = {
    "spark.sql.ansi.enabled": "true",
    "spark.sql.runSQLOnFiles": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Adaptive execution drops the joins of a side it finds empty as the query runs:
    # whether one unit's rows are there then decides the whole query's work (a 10-scan
    # self-join filtered on one unit: +473 ms with it). Plans follow the SQL alone.
    "spark.sql.adaptive.optimizer.excludedRules": (
        "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"
    ),
}
_lock = threading.Lock()


class SparkMissing(RuntimeError):
    def __init__(self) -> None:
        super().__init__(
            'this policy serves a dataset with engine = "spark", but pyspark (with its '
            "Spark Connect client) is not installed: pip install 'dpmagic[spark]' (Spark "
            "also needs Java 17 or newer)"
        )


def isolated(config: SparkConfig) -> SparkSession:
    """A session of its own over the process's Spark (``session``): its own temporary
    views and settings, so that two datasets' tables of the same name never meet."""
    base = session(config)
    # A Spark Connect client makes a new server-side session per ``create``.
    spark = _connect(config, new=True) if config.remote is not None else base.newSession()
    _pin(spark)
    return spark


def session(config: SparkConfig) -> SparkSession:
    """The session ``config`` names: started (or reached, for Spark Connect) once per
    process; the pinned settings are set again on every call."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkMissing() from None
    with _lock:
        log.info("starting Spark (%s)", config.where)
        if config.remote is not None:
            spark = _connect(config, new=False)
        else:
            master = required(config.master, "the Spark master")
            builder = SparkSession.builder.appName("dpmagic-gate").master(master)
            for key, value in (*config.conf, *PINNED.items()):
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            # Spark's own log goes to the gate's stderr: warnings about its setup, not ours.
            spark.sparkContext.setLogLevel("ERROR")
        _pin(spark)
        return spark


def _connect(config: SparkConfig, new: bool) -> SparkSession:
    """A Spark Connect session. pyspark's builder puts the whole process in Connect
    mode (its column functions then build Connect expressions), so a process serves
    Spark through one ``master`` or one ``remote``, as the policy requires. The
    server's own settings (its UI, its logs) are its owner's: a client sets a
    session's SQL settings only."""
    from pyspark.sql import SparkSession

    try:
        import pyspark.sql.connect.session  # noqa: F401  (the client's gRPC libraries)
    except ImportError:
        raise SparkMissing() from None
    builder = SparkSession.builder.remote(required(config.remote, "the Connect URL"))
    for key, value in config.conf:
        builder = builder.config(key, value)
    return builder.create() if new else builder.getOrCreate()


def _pin(spark: SparkSession) -> None:
    """Set the pinned SQL settings on ``spark`` and read them back: a session that does
    not hold them (a server that refuses or rewrites one) is not served."""
    for key, value in PINNED.items():
        if key.startswith("spark.sql."):  # the runtime ones, set on the session itself
            spark.conf.set(key, value)
            if str(spark.conf.get(key)).lower() != value.lower():
                raise RuntimeError(f"Spark does not hold the gate's setting {key} = {value}")
