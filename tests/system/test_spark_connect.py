"""Spark Connect: the gate reaching Spark through a Connect server (``remote``),
marker ``spark``.

The server is Spark's own (``SparkConnectServer`` on ``local[2]``, started with
the ``spark-submit`` that pyspark ships, its jar inside the wheel): the protocol
Databricks and a cluster's Connect endpoint speak. It runs on this machine, so
the sources and the ``prepared`` folder are at the same paths for the gate and
the server, as a shared file system makes them on a cluster.

* A real gate process serves a dataset through it: the schema names the server
  without the URL's parameters, answers are noisy aggregates of the right size,
  the budget is charged, Spark's refusals are free, and a restart reuses the
  prepared tables that the server wrote (found through Spark, not the gate's
  file system).
* A catalog table of the server is a source; the guard stops what the server
  would run unguarded; a query past the timeout is interrupted through its
  operation tag (Connect's way; classic mode uses job groups) and the session
  answers after.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import socket
import subprocess
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("grpc", reason="Spark Connect's client needs the spark extra's grpcio")

from dpmagic.client.errors import QueryRefused  # noqa: E402
from dpmagic.client.http_gate import Gate  # noqa: E402
from dpmagic.gate.engines.interface import OutOfResources  # noqa: E402
from dpmagic.gate.engines.spark.database import SparkDatabase  # noqa: E402
from dpmagic.gate.engines.spark.guard import UnsafeSparkSQL  # noqa: E402
from dpmagic.gate.engines.spark.prepare import COMPLETE  # noqa: E402
from dpmagic.gate.policy import parse_policy  # noqa: E402
from tests.conftest import GateProcess  # noqa: E402

pytestmark = pytest.mark.spark

SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_S = 180  # a JVM and a Spark driver on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server on ``local[2]``; its URL with a parameter the gate must
    not repeat (a stand-in for Databricks's token)."""
    home = Path(pyspark.__file__).parent
    port = _free_port()
    folder = tmp_path_factory.mktemp("connect")
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(
        [
            str(home / "bin" / "spark-submit"),
            "--class", SERVER,
            "--master", "local[2]",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.sql.warehouse.dir={folder / 'warehouse'}",
        ],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "SPARK_HOME": str(home)},
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + START_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"the Spark Connect server did not start ({log.name})")
            time.sleep(0.5)
    try:
        yield f"sc://localhost:{port}/;user_id=dpmagic-gate"
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _parquet(path: Path, rows: int = 600) -> Path:
    """Patients with up to 12 visits (bounds 2 and 2 below)."""
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT i % 50 AS patient_id, (i * 7) % 31 AS stay_days, i % 3 AS kind "
        f"FROM range({rows}) t(i)) TO '{path}' (FORMAT parquet)"
    )
    con.close()
    return path


def _dataset(source: str, remote: str, prepared: Path) -> dict:
    return {
        "sources": {"visits": source},
        "privacy_unit": "patient_id",
        "max_partitions": 2,
        "max_rows_per_partition": 2,
        "user_budget": {"epsilon": 5.0},
        "engine": "spark",
        "spark": {"remote": remote, "prepared": str(prepared)},
        "tables": {
            "visits": {
                "columns": {
                    "patient_id": {"type": "int"},
                    "stay_days": {"type": "int", "lower": 0, "upper": 30},
                    "kind": {"type": "int", "public_values": [0, 1, 2]},
                }
            }
        },
    }


def test_a_gate_process_answers_through_spark_connect(
    connect: str, tmp_path: Path, short_dir: Path
) -> None:
    _parquet(tmp_path / "visits.parquet", rows=100)  # 2 rows a patient: none left out
    prepared = tmp_path / "prepared"
    (tmp_path / "policy.toml").write_text(
        '[gate]\nstate_dir = "state"\nresponse_quantum_ms = 0\n\n'
        "[datasets.clinic]\n"
        f'engine = "spark"\nspark = {{ remote = "{connect}", prepared = "{prepared}" }}\n'
        'sources = { visits = "visits.parquet" }\nprivacy_unit = "patient_id"\n'
        "max_partitions = 2\nmax_rows_per_partition = 2\n"
        "user_budget = { epsilon = 5.0 }\n"
        "[datasets.clinic.tables.visits.columns]\n"
        'patient_id = { type = "int" }\nstay_days = { type = "int", lower = 0, upper = 30 }\n'
        'kind = { type = "int", public_values = [0, 1, 2] }\n'
    )
    process = GateProcess(tmp_path / "policy.toml", f"unix:{short_dir / 'gate.sock'}")
    started = time.monotonic()
    process.start()
    try:
        start_s = time.monotonic() - started
        client = Gate(process.address)
        schema = client.schema("clinic")
        assert schema["engine"] == "spark"
        assert schema["spark"] == {"remote": connect.split("/;")[0]}  # no parameters
        sql = "SELECT kind, COUNT(*) AS n FROM visits GROUP BY kind"
        reply = client.query(sql, dataset="clinic", epsilon=1.0).reply
        assert reply["engine"] == "spark"
        # Rows i < 100, kind i % 3: 34, 33, 33. A unit moves the counts by at most 2
        # in L1 (Laplace scale 2 at ε = 1): a cell off by 40 has probability e^-20.
        exact = {0: 34, 1: 33, 2: 33}
        assert sorted(r[0] for r in reply["rows"]) == [0, 1, 2]
        assert all(abs(n - exact[k]) < 40 for k, n in reply["rows"])
        with pytest.raises(QueryRefused, match="served by Spark"):
            client.query("SELECT COUNT(*) FROM visits WHERE stay_days", dataset="clinic",
                         epsilon=1.0)  # fmt: skip
        assert client.budget("clinic")["user"]["spent"]["epsilon"] == pytest.approx(1.0)
    finally:
        process.stop()
    (version,) = [p for p in prepared.iterdir() if p.is_dir()]
    assert (version / COMPLETE).is_dir()
    written = (version / "visits").stat().st_mtime_ns

    process.start()  # the server still holds the prepared tables: reused, not redone
    try:
        again = Gate(process.address).query(
            "SELECT SUM(stay_days) FROM visits", dataset="clinic", epsilon=1.0
        )
        # A unit's 2 rows move the sum by at most 60 (scale 60 at ε = 1): e^-20 to miss.
        exact = sum((i * 7) % 31 for i in range(100))
        assert abs(again.reply["rows"][0][0] - exact) < 1200
    finally:
        process.stop()
    assert [p for p in prepared.iterdir() if p.is_dir()] == [version]
    assert (version / "visits").stat().st_mtime_ns == written
    print(f"\ngate start through Spark Connect: {start_s:.1f} s")


def test_a_catalog_table_the_guard_and_the_timeout_through_spark_connect(
    connect: str, tmp_path: Path
) -> None:
    """Run in a Python process of its own, as a gate would be: pyspark puts a whole
    process in classic or Connect mode, and this one runs a classic session for the
    other Spark tests (a gate serves one kind only)."""
    context = multiprocessing.get_context("spawn")
    failures = context.Queue()
    child = context.Process(target=_in_a_process, args=(connect, str(tmp_path), failures))
    child.start()
    child.join(300)
    if child.is_alive():
        child.kill()
        pytest.fail("the Spark Connect checks did not end within 300 s")
    try:
        failure = failures.get(timeout=10)
    except queue.Empty:
        failure = f"the child process exited with {child.exitcode} and no report"
    assert child.exitcode == 0 and failure is None, failure


def _in_a_process(connect: str, folder: str, failures) -> None:
    try:
        _catalog_guard_timeout(connect, Path(folder))
    except BaseException:
        failures.put(traceback.format_exc())
        raise
    failures.put(None)


def _catalog_guard_timeout(connect: str, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    source = _parquet(tmp_path / "lake.parquet")
    owner = SparkSession.builder.remote(connect).create()  # the cluster owner's session
    owner.sql(f"CREATE TABLE lake_visits USING parquet LOCATION '{source}'")
    try:
        raw = {
            "gate": {"state_dir": str(tmp_path / "state"), "query_timeout_s": 1.0},
            "datasets": {"v": _dataset("table:lake_visits", connect, tmp_path / "prepared")},
        }
        policy = parse_policy(raw, tmp_path / "p.toml")
        store = SparkDatabase(policy.dataset("v"), policy.gate)
        assert store.run("SELECT COUNT(*) FROM visits").rows == [(600,)]
        # ANSI mode is on in the gate's session, whatever the server's default.
        assert store.spark.conf.get("spark.sql.ansi.enabled") == "true"

        unsafe = "SELECT reflect('java.lang.System', 'getProperty', 'user.name')"
        assert store.spark.sql(unsafe).collect()  # unguarded, the server answers it
        with pytest.raises(UnsafeSparkSQL):
            store.vet(unsafe)
        with pytest.raises(UnsafeSparkSQL):
            store.run(unsafe)

        heavy = (
            "SELECT COUNT(*) FROM visits a, visits b, visits c, visits d "
            "WHERE a.stay_days + b.stay_days + c.stay_days + d.stay_days >= 0"
        )  # 600^4 joined rows: minutes of work
        started = time.monotonic()
        with pytest.raises(OutOfResources):
            store.run(heavy)
        assert time.monotonic() - started < 20
        assert store.run("SELECT COUNT(*) FROM visits").rows == [(600,)]
    finally:
        owner.sql("DROP TABLE IF EXISTS lake_visits")
        owner.stop()
    shutil.rmtree(tmp_path / "prepared", ignore_errors=True)
