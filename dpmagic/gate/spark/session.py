"""The gate's Spark session: one per gate process, settings pinned.

A Python process has one Spark driver (its JVM), so every Spark dataset of a gate
shares one session (the policy requires the same ``master``/``remote`` and
``conf``). The gate's own settings are applied after the owner's ``conf`` and win:

* ``spark.sql.ansi.enabled = true``: arithmetic that overflows raises instead of
  wrapping around silently. Every row expression the gate runs is proven unable
  to raise (``sql/spark_dialect.py``), so ANSI mode never fails a query on data;
  it makes a gate bug loud instead of a wrong answer.
* ``spark.sql.runSQLOnFiles = false``: no ``parquet.`/path``` table can name a file.
* ``spark.sql.session.timeZone = UTC``: dates read and compared the same everywhere.
* ``spark.ui.enabled = false``: the web UI would show plans and query text.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

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
}
_lock = threading.Lock()


class SparkMissing(RuntimeError):
    def __init__(self) -> None:
        super().__init__(
            'this policy serves a dataset with engine = "spark", but pyspark is not '
            "installed: pip install 'dpmagic[spark]' (Spark also needs Java 17 or newer)"
        )


def isolated(config: SparkConfig) -> SparkSession:
    """A session of its own over the process's Spark (``session``): its own temporary
    views and settings, so that two datasets' tables of the same name never meet."""
    base = session(config)
    if config.remote is not None:
        from pyspark.sql import SparkSession

        # A Spark Connect client makes a new server-side session per ``create``.
        spark = SparkSession.builder.remote(config.remote).create()
    else:
        spark = base.newSession()
    for key, value in PINNED.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    return spark


def session(config: SparkConfig) -> SparkSession:
    """The session ``config`` names: started (or reached, for Spark Connect) once per
    process; the pinned settings are set again on every call."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkMissing() from None
    with _lock:
        builder = SparkSession.builder.appName("dpmagic-gate")
        builder = builder.remote(config.remote) if config.remote else builder.master(config.master)
        for key, value in (*config.conf, *PINNED.items()):
            builder = builder.config(key, value)
        log.info("starting Spark (%s)", config.remote or config.master)
        spark = builder.getOrCreate()
        for key, value in PINNED.items():
            if key.startswith("spark.sql."):  # the runtime ones, set on the session itself
                spark.conf.set(key, value)
        if config.master is not None:
            # Spark's own log goes to the gate's stderr: warnings about its setup, not ours.
            spark.sparkContext.setLogLevel("ERROR")
        return spark
