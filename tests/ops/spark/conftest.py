"""A real local SparkSession (session-scoped) and a real `pidctl serve` for the Spark tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.testing.postgres import PostgresProcess
from ops.testing.serverproc import ServerProcess

#: Where Debian's libpostgresql-jdbc-java puts the driver (ops/dev.sh installs it).
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` at the sink's database ``url``."""
    from pidctl.spark.sqlstore import open_store

    store = open_store(url)
    try:
        return [tuple(row) for row in store.execute(sql).fetchall()]
    finally:
        store.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """local[2,3]: two task threads, and a failed task is tried up to 3 times (plain local
    mode never retries). Workers run this interpreter, where pidctl is installed."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from ops.testing.jars import classpath
    from pidctl.spark import carrier, register_data_sources

    # pidctl-kafka's JVM carrier (write_kafka's path), built against the Kafka client jar
    # ops.testing.jars fetched; and that jar, as spark-submit --jars would give it.
    clients = next(p for p in classpath("spark-kafka").split(os.pathsep) if "kafka-clients" in p)
    jars = [POSTGRES_JDBC_JAR, str(carrier.build(Path(clients))), clients]
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("pidctl-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        # PostgreSQL's JDBC driver (Debian's libpostgresql-jdbc-java): write_sql's path;
        # pidctl-kafka's carrier: write_kafka's.
        .config("spark.jars", ",".join(jars))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register_data_sources(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pidctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One controller for the session; small segments, all kept, so the log reader has
    several partitions."""
    data_dir: Path = tmp_path_factory.mktemp("pidctl") / "data"
    keep = ("--segment-max-bytes", "20000", "--log-retention-bytes", "100000000")
    with ServerProcess(data_dir, *keep) as server:
        yield server


@pytest.fixture(scope="session")
def job_pidctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A controller serving Spark jobs that write to Kafka: its producer ids from 2^62, far
    above the test broker's own (from 0), as docs/spark-kafka.md says to set it up (the sink
    refuses ids in the cluster's range)."""
    data_dir: Path = tmp_path_factory.mktemp("job-pidctl") / "data"
    with ServerProcess(data_dir, "--first-producer-id", str(2**62)) as server:
        yield server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresProcess]:
    """A throwaway PostgreSQL server (Debian's postgresql) for the session."""
    with PostgresProcess() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The sink's database, each test its own: a SQLite file, or a fresh PostgreSQL database
    of the session's server."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'sink.db'}"
    server: PostgresProcess = request.getfixturevalue("postgres")
    return server.new_database()
