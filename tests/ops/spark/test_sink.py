"""The exactly-once SQL sink in a real local SparkSession, on SQLite and on PostgreSQL."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from ops.testing.serverproc import ServerProcess, add_sasl_user
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.log.recovery import read_log
from pidctl.spark.sink import ExactlyOnceWriter, PidctlSqlSink, SinkOptionError
from tests.ops.spark.conftest import query

ROWS = 6000
PARTITIONS = 6


def _write(
    df: Any, pidctl: ServerProcess, url: str, sink: str = "pidctl-sql", **options: str
) -> None:
    writer = df.write.format(sink).mode("append")
    settings = {
        "bootstrap": pidctl.bootstrap,
        "url": url,
        "table": "events",
        "partitions": str(df.rdd.getNumPartitions()),
        "batchSize": "250",
        "clientId": "test-job",
        **options,
    }
    for name, value in settings.items():
        writer = writer.option(name, value)
    writer.save()


class FailingWriter(ExactlyOnceWriter):
    """The real writer, in a task that dies after 600 of its rows (so after two batches of
    250 were committed): on the first attempt of the partitions in option ``failPartitions``,
    or on every attempt with ``failAlways``. Spark feeds a Python data source writer its
    partition only once the upstream task has produced all of it, so a failure upstream
    could never leave partial output; this one happens where a crash of the writing task
    would."""

    def __init__(self, options: dict[str, str], schema: Any) -> None:
        super().__init__(options, schema)
        # Spark hands options over with lower-cased names.
        self.fail = {int(p) for p in options.get("failpartitions", "").split(",") if p}
        self.always = options.get("failalways") == "true"

    def rows(self, record_batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        rows = super().rows(record_batches)
        if context.partitionId() in self.fail and (self.always or context.attemptNumber() == 0):
            rows = _fail_after(rows, 600)
        return rows


def _fail_after(rows: Iterator[Any], count: int) -> Iterator[Any]:
    for index, row in enumerate(rows):
        if index == count:
            raise RuntimeError("injected failure after part of the output")
        yield row


class FailingSink(PidctlSqlSink):
    @classmethod
    def name(cls) -> str:
        return "pidctl-sql-failing"

    def writer(self, schema: Any, overwrite: bool) -> FailingWriter:
        return FailingWriter(dict(self.options), schema)


# Spark workers cannot import the tests: this module's classes travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module", autouse=True)
def failing_sink(spark: Any) -> None:
    spark.dataSource.register(FailingSink)


def _source(spark: Any) -> Any:
    """ROWS rows in PARTITIONS partitions of 1,000."""
    return spark.range(0, ROWS, 1, PARTITIONS).selectExpr("id", "concat('row-', id) AS name")


def test_failed_first_attempts_leave_every_row_exactly_once(
    spark: Any, pidctl: ServerProcess, url: str
) -> None:
    _write(_source(spark), pidctl, url, "pidctl-sql-failing", failPartitions="1,4")
    rows = query(url, "SELECT id, name FROM events ORDER BY id")
    assert rows == [(i, f"row-{i}") for i in range(ROWS)]
    commits = query(
        url,
        "SELECT producer_id, final_sequence, rows_written, duplicate_rows "
        "FROM pidctl_sink_commits ORDER BY producer_id",
    )
    assert len(commits) == PARTITIONS
    assert all(final == ROWS // PARTITIONS - 1 for _, final, _, _ in commits)
    # The retried partitions skipped what their failed attempts had committed (2 batches).
    assert (
        sorted((written, dup) for *_, written, dup in commits) == [(500, 500)] * 2 + [(1000, 0)] * 4
    )
    per_producer = query(
        url,
        "SELECT pidctl_producer_id, COUNT(*), MIN(pidctl_sequence), MAX(pidctl_sequence) "
        "FROM events GROUP BY pidctl_producer_id",
    )
    assert sorted(n for _, n, _, _ in per_producer) == [ROWS // PARTITIONS] * PARTITIONS
    assert all((lo, hi) == (0, ROWS // PARTITIONS - 1) for _, _, lo, hi in per_producer)


def test_two_attempts_of_one_partition_writing_at_once(
    spark: Any, pidctl: ServerProcess, url: str
) -> None:
    """What speculative execution does: two tasks write the same partition concurrently."""
    schema = spark.range(1).selectExpr("id", "'x' AS name").schema
    options = {
        "bootstrap": pidctl.bootstrap,
        "url": url,
        "table": "events",
        "partitions": "1",
        "batchSize": "20",
        "clientId": "speculative",
    }
    writer = PidctlSqlSink(options).writer(schema, False)  # on the driver, as Spark would
    rows = [(i, f"row-{i}") for i in range(3000)]

    def attempt(_: int) -> Any:
        return writer.write_partition(0, rows)

    reports = spark.sparkContext.parallelize([0, 1], 2).map(attempt).collect()
    assert query(url, "SELECT COUNT(*) FROM events") == [(0,)]  # staged, not yet published
    writer.commit(reports[:1])  # Spark keeps one message per partition
    assert sorted(query(url, "SELECT id, name FROM events")) == rows
    done = [r.report for r in reports if r.report is not None]
    written = [r.rows_written for r in done]
    duplicates = [r.duplicate_rows for r in done]
    assert sum(written) == 3000 and sum(duplicates) == 3000
    assert len(done) == 2 and all(r.final_sequence == 2999 for r in done)


def test_a_failing_job_is_aborted_without_leaving_its_rows(
    spark: Any, pidctl: ServerProcess, url: str
) -> None:
    kept = spark.range(0, 10, 1, 1).selectExpr("id + 100000 AS id", "'kept' AS name")
    _write(kept, pidctl, url, clientId="earlier-job")
    with pytest.raises(Exception, match="injected failure"):
        _write(
            _source(spark),
            pidctl,
            url,
            "pidctl-sql-failing",
            clientId="failing-job",
            failPartitions="2",
            failAlways="true",
        )
    rows = query(url, "SELECT id, name FROM events ORDER BY id")
    assert rows == [(100000 + i, "kept") for i in range(10)]
    assert query(url, "SELECT job, state, reason FROM pidctl_sink_writes ORDER BY started_at") == [
        ("earlier-job", "committed", None),
        ("failing-job", "aborted", "the Spark job failed"),
    ]
    assert query(url, "SELECT COUNT(*) FROM pidctl_stage_events") == [(0,)]


def test_the_job_is_known_by_its_application_id(
    spark: Any, pidctl: ServerProcess, tmp_path: Path
) -> None:
    url = f"sqlite://{tmp_path / 'app.db'}"
    (
        spark.range(0, 10, 1, 2)
        .write.format("pidctl-sql")
        .mode("append")
        .option("bootstrap", pidctl.bootstrap)
        .option("url", url)
        .option("table", "t")
        .option("partitions", "2")
        .save()
    )
    app = spark.sparkContext.applicationId
    assert set(query(url, "SELECT job FROM pidctl_sink_commits")) == {(app,)}
    records = [e.record for e in read_log(pidctl.data_dir).entries()]
    grants = [r for r in records if isinstance(r, ProducerIdsGranted) and r.client_id == app]
    assert grants and all(g.holder == "job" for g in grants)


def test_options_are_checked(spark: Any, pidctl: ServerProcess, tmp_path: Path) -> None:
    df = spark.range(3)
    base = {"bootstrap": pidctl.bootstrap, "url": str(tmp_path / "x.db"), "table": "t"}
    with pytest.raises(SinkOptionError, match=r'needs \.option\("table"'):
        PidctlSqlSink({k: v for k, v in base.items() if k != "table"}).writer(df.schema, False)
    with pytest.raises(ValueError, match="is not a plain SQL identifier"):
        PidctlSqlSink({**base, "table": "t; DROP TABLE x"}).writer(df.schema, False)
    with pytest.raises(SinkOptionError, match="only appends"):
        PidctlSqlSink(base).writer(df.schema, True)
    with pytest.raises(SinkOptionError, match="batchSize must be a positive integer"):
        PidctlSqlSink({**base, "batchSize": "0"}).writer(df.schema, False)
    with pytest.raises(SinkOptionError, match="txnAppId and txnVersion go together"):
        PidctlSqlSink({**base, "txnAppId": "nightly"}).writer(df.schema, False)
    with pytest.raises(SinkOptionError, match="txnVersion must be a non-negative integer"):
        PidctlSqlSink({**base, "txnAppId": "a", "txnVersion": "v1"}).writer(df.schema, False)
    with pytest.raises(SinkOptionError, match="abandonedAfterSeconds must be a non-negative"):
        PidctlSqlSink({**base, "abandonedAfterSeconds": "-1"}).writer(df.schema, False)
    with pytest.raises(SinkOptionError, match=r"txnAppId/txnVersion apply to batch writes"):
        PidctlSqlSink({**base, "txnAppId": "a", "txnVersion": "1"}).streamWriter(df.schema, False)


@pytest.fixture(scope="module")
def secured_pidctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """pidctl with a SASL_PLAINTEXT listener and ACLs: only User:spark may take job blocks."""
    tmp = tmp_path_factory.mktemp("secured")
    add_sasl_user(tmp / "users.json", "spark", "spark-pw")
    acls = (
        '[{"principal": "User:spark", "operation": "IdempotentWrite", "resource_type": "Cluster"}]'
    )
    with ServerProcess(
        tmp / "data",
        "--listeners",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--credentials-file",
        str(tmp / "users.json"),
        "--authorizer",
        "acl",
        env={"PIDCTL_ACLS": acls},
    ) as server:
        yield server


def test_a_secured_pidctl_with_kafka_client_properties(
    spark: Any, secured_pidctl: ServerProcess, tmp_path: Path
) -> None:
    url = f"sqlite://{tmp_path / 'secured.db'}"
    sasl = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "spark",
    }
    _write(_source(spark), secured_pidctl, url, **sasl, **{"sasl.password": "spark-pw"})
    assert query(url, "SELECT COUNT(*) FROM events") == [(ROWS,)]
    wrong = r"PreallocationError: pidctl at .*: Authentication failed: invalid username or"
    with pytest.raises(Exception, match=wrong):
        _write(_source(spark), secured_pidctl, url, **sasl, **{"sasl.password": "wrong"})
    with pytest.raises(Exception, match=r"SASL_PLAINTEXT needs sasl\.password"):
        _write(_source(spark), secured_pidctl, url, **sasl)
    assert query(url, "SELECT COUNT(*) FROM events") == [(ROWS,)]
