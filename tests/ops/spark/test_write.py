"""``write_sql``: the batch sink through Spark's JDBC writer (PostgreSQL) or the data source
(SQLite), in a real local SparkSession against a real pidctl and database. What the driver
decides is decided before any task: no Spark job runs (Spark's status tracker says so)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.testing.postgres import PostgresProcess
from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.spark import write_sql
from pidctl.spark.sink import SinkOptionError
from pidctl.spark.sqlstore import (
    ConcurrentWriteError,
    SchemaMismatch,
    Write,
    WriteState,
    open_store,
    write_stage_table,
)
from tests import docs
from tests.ops.spark.conftest import query

ROWS, PARTITIONS = 3000, 6


def _execute(url: str, *statements: str) -> None:
    store = open_store(url)
    try:
        for sql in statements:
            store.execute(sql)
        store.connection.commit()
    finally:
        store.close()


def _source(spark: Any, rows: int = ROWS, partitions: int = PARTITIONS) -> Any:
    return spark.range(0, rows, 1, partitions).selectExpr("id", "concat('row-', id) AS name")


class NoJobs:
    """Runs its block in a job group of its own; ``jobs`` are the Spark jobs it started."""

    counter = 0

    def __init__(self, spark: Any) -> None:
        NoJobs.counter += 1
        self.context, self.group = spark.sparkContext, f"pidctl-test-{NoJobs.counter}"

    def __enter__(self) -> NoJobs:
        self.context.setJobGroup(self.group, "checked for jobs")
        return self

    def __exit__(self, *exc: object) -> None:
        self.context.setLocalProperty("spark.jobGroup.id", None)

    @property
    def jobs(self) -> list[int]:
        return list(self.context.statusTracker().getJobIdsForGroup(self.group))


def _stages_left(url: str) -> list[str]:
    if url.startswith("sqlite"):
        sql = "SELECT name FROM sqlite_master WHERE name LIKE 'pidctl_stage_w%'"
    else:
        sql = (
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_name LIKE 'pidctl_stage_w%'"
        )
    return [row[0] for row in query(url, sql)]


def test_every_row_once_with_its_producer_and_sequence(
    spark: Any, pidctl: ServerProcess, url: str
) -> None:
    result = write_sql(_source(spark), bootstrap=pidctl.bootstrap, url=url, table="events")
    assert result.state == "committed"
    assert query(url, "SELECT id, name FROM events ORDER BY id") == [
        (i, f"row-{i}") for i in range(ROWS)
    ]
    per_producer = query(
        url,
        "SELECT pidctl_producer_id, COUNT(*), MIN(pidctl_sequence), MAX(pidctl_sequence)"
        " FROM events GROUP BY pidctl_producer_id",
    )
    assert sorted((n, low, high) for _, n, low, high in per_producer) == [(500, 0, 499)] * 6
    commits = query(
        url, "SELECT final_sequence, rows_written, duplicate_rows FROM pidctl_sink_commits"
    )
    assert sorted(commits) == [(499, 500, 0)] * 6
    assert query(url, "SELECT state, rows_published FROM pidctl_sink_writes") == [
        ("committed", ROWS)
    ]
    assert _stages_left(url) == []


def test_a_committed_version_is_skipped_on_the_driver_before_any_task(
    spark: Any, pidctl: ServerProcess, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    txn = {"bootstrap": pidctl.bootstrap, "url": url, "table": "events", "txnAppId": "nightly"}
    first = write_sql(_source(spark), txnVersion=7, **txn)
    for version in (7, 6):
        with NoJobs(spark) as watch, caplog.at_level("WARNING", logger="pidctl.spark"):
            again = write_sql(_source(spark), txnVersion=version, **txn)
        assert watch.jobs == []  # decided on the driver: no Spark job ran
        assert again.state == "skipped"
        said = f"version 7 of nightly was committed by write {first.write_id}"
        assert again.reason == f"{said}: version {version} writes nothing"
        assert again.reason in caplog.text
    assert query(url, "SELECT COUNT(*) FROM events") == [(ROWS,)]
    skipped = query(
        url,
        "SELECT app_version, reason FROM pidctl_sink_writes WHERE state = 'skipped'"
        " ORDER BY app_version",
    )
    assert [version for version, _ in skipped] == [6, 7]
    assert all(reason.startswith(said) for _, reason in skipped)


SINK_DOC = "docs/spark-sink.md"


def test_the_documented_write_runs_as_written(
    spark: Any, pidctl: ServerProcess, postgres: PostgresProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/spark-sink.md's ``write_sql`` block as written, its addresses moved to the test's
    and ``orders`` a DataFrame of 1,000 rows: it prints what its comment says (the state and
    the rows), and run again, the committed version writes nothing."""
    section = 'The exactly-once SQL sink (`write_sql`, `format("pidctl-sql")`)'
    url = postgres.new_database()
    moves = {"127.0.0.1:9093": pidctl.bootstrap, "postgresql://user@db/shop": url}
    code = compile(docs.moved(docs.block(SINK_DOC, section), moves), SINK_DOC, "exec")
    orders = spark.range(0, 1000, 1, 4).selectExpr("id", "concat('order-', id) AS name")
    for printed in ("committed 1000", "skipped 0"):
        exec(code, {"orders": orders})
        assert capsys.readouterr().out == printed + "\n"
    assert query(url, "SELECT COUNT(*), COUNT(DISTINCT id) FROM orders") == [(1000, 1000)]


def test_schema_problems_are_named_on_the_driver_before_any_task(
    spark: Any, pidctl: ServerProcess, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = {"bootstrap": pidctl.bootstrap, "url": url}
    _execute(url, "CREATE TABLE other_columns (id BIGINT, amount REAL)")
    with NoJobs(spark) as watch, pytest.raises(SchemaMismatch) as raised:
        write_sql(_source(spark), table="other_columns", **options)
    assert watch.jobs == []
    assert str(raised.value) == (
        "table other_columns: columns differ: the DataFrame's 'name' not in the table; the"
        " table's 'amount' not in the DataFrame (select the table's columns, or ALTER TABLE"
        " first)"
    )
    # A table of the right columns without the audit columns: they are added, and said so.
    _execute(
        url,
        "CREATE TABLE no_audit (id BIGINT, name TEXT)",
        "INSERT INTO no_audit VALUES (-1, 'old')",
    )
    with caplog.at_level("WARNING", logger="pidctl.spark"):
        write_sql(_source(spark), table="no_audit", **options)
    assert (
        "added the audit column(s) pidctl_producer_id, pidctl_sequence to the existing"
        in caplog.text
    )
    assert query(url, "SELECT COUNT(*), COUNT(pidctl_producer_id) FROM no_audit") == [
        (ROWS + 1, ROWS)
    ]
    # A column added to the table, and to the DataFrame, on a later run: every path follows.
    _execute(url, "ALTER TABLE no_audit ADD COLUMN added TEXT")
    wider = _source(spark).selectExpr("id", "name", "'new' AS added")
    write_sql(wider, table="no_audit", **options)
    wider.write.format("pidctl-sql").mode("append").option("table", "no_audit").option(
        "partitions", str(PARTITIONS)
    ).options(**options).save()
    assert query(url, "SELECT COUNT(*) FROM no_audit WHERE added = 'new'") == [(2 * ROWS,)]


def test_reserved_words_and_the_case_of_a_table_name(
    spark: Any, pidctl: ServerProcess, url: str
) -> None:
    """``order``, ``user`` and a column ``select`` are plain names; ``Orders_CF``,
    ``orders_cf`` and ``ORDERS_CF`` are the database's one table, and one key for versions."""
    options = {"bootstrap": pidctl.bootstrap, "url": url}
    reserved = spark.range(0, 10, 1, 2).selectExpr("id AS select", "'u' AS user", "id AS order")
    for table in ("order", "user"):
        write_sql(reserved, table=table, **options)
        assert query(url, f'SELECT COUNT(DISTINCT "select"), MIN("user") FROM "{table}"') == [
            (10, "u")
        ]
    results = [
        write_sql(_source(spark), table=table, txnAppId="cf", txnVersion=1, **options)
        for table in ("Orders_CF", "orders_cf", "ORDERS_CF")
    ]
    assert [r.state for r in results] == ["committed", "skipped", "skipped"]
    assert query(url, "SELECT COUNT(*), COUNT(DISTINCT id) FROM orders_cf") == [(ROWS, ROWS)]
    assert query(url, "SELECT DISTINCT table_name FROM pidctl_sink_writes WHERE app_id = 'cf'") == [
        ("orders_cf",)
    ]


def test_the_allocation_is_sized_from_the_dataframe_and_a_smaller_one_refused(
    spark: Any, pidctl: ServerProcess, url: str
) -> None:
    options = {"bootstrap": pidctl.bootstrap, "url": url, "table": "events"}
    with NoJobs(spark) as watch, pytest.raises(SinkOptionError) as raised:
        write_sql(_source(spark, 3000, 1500), partitions=1000, **options)
    assert watch.jobs == []
    assert str(raised.value).startswith(
        "option partitions is 1000, but the DataFrame has 1500 partitions"
    )
    if url.startswith("postgresql"):  # 1,500 tasks on the SQLite path would take minutes
        write_sql(_source(spark, 3000, 1500), **options)  # two blocks of producer ids
        assert query(url, "SELECT COUNT(DISTINCT pidctl_producer_id) FROM events") == [(1500,)]


def test_a_failed_job_leaves_nothing(spark: Any, pidctl: ServerProcess, url: str) -> None:
    options = {"bootstrap": pidctl.bootstrap, "url": url, "table": "events"}
    failing = _source(spark).selectExpr(
        "IF(id = 2900, raise_error('injected failure'), id) AS id", "name"
    )
    with pytest.raises(Exception, match="injected failure"):
        write_sql(failing, clientId="failing-job", **options)
    assert query(url, "SELECT COUNT(*) FROM events") == [(0,)]
    ((state, reason),) = query(url, "SELECT state, reason FROM pidctl_sink_writes")
    assert state == "aborted" and reason.startswith("the Spark job failed")
    assert _stages_left(url) == []


@pytest.fixture
def postgres_url(postgres: PostgresProcess) -> str:
    """A fresh PostgreSQL database: for write_sql's own path (a per-write stage, its
    publish), which SQLite does not take."""
    return postgres.new_database()


def test_copies_of_retried_attempts_are_published_once(postgres_url: str) -> None:
    """What an attempt retried after its transaction committed (or a speculative one) leaves:
    a second whole copy of its partition. One copy is published; anything that is not whole
    copies, or a stage a crash emptied, publishes nothing."""
    url = postgres_url
    store = open_store(url)
    try:
        columns = store.create_tables("t", [("id", "BIGINT")])

        def staged(write_id: str, rows: list[tuple[int, int, int]]) -> str:
            store.begin_staged_write(Write(write_id, "t", "job"), [("id", "BIGINT")])
            stage = write_stage_table(write_id)
            store.connection.cursor().executemany(
                f"INSERT INTO {stage} (id, pidctl_producer_id, pidctl_sequence)"
                " VALUES (%s, %s, %s)",
                rows,
            )
            store.connection.commit()
            return stage

        once = [(i, 5, i) for i in range(3)]
        staged("w1", once + once + [(10 + i, 6, i) for i in range(2)])
        outcome = store.publish_stage("w1", "t", columns, 0)
        assert (outcome.state, outcome.rows) == (WriteState.COMMITTED, 5)
        rows = store.execute("SELECT id, pidctl_producer_id, pidctl_sequence FROM t").fetchall()
        assert sorted(rows) == sorted([*once, (10, 6, 0), (11, 6, 1)])
        commits = store.execute(
            "SELECT producer_id, final_sequence, rows_written, duplicate_rows FROM"
            " pidctl_sink_commits ORDER BY producer_id"
        ).fetchall()
        assert commits == [(5, 2, 3, 3), (6, 1, 2, 0)]
        store.connection.commit()

        staged("w2", once + once[:2])  # not whole copies
        with pytest.raises(RuntimeError, match="not whole copies of a partition"):
            store.publish_stage("w2", "t", columns, 0)
        stage = staged("w3", once)
        store.execute(f"DELETE FROM {stage} WHERE pidctl_producer_id = -1")  # what a crash does
        store.connection.commit()
        with pytest.raises(RuntimeError, match="its staging table lost its rows"):
            store.publish_stage("w3", "t", columns, 0)
        assert len(store.execute("SELECT * FROM t").fetchall()) == 5
        store.connection.commit()
    finally:
        store.close()


def test_an_attempt_still_staging_is_waited_for_and_counted(postgres_url: str) -> None:
    """An attempt whose transaction is still open when the publish starts (a zombie of a
    finished job, or a speculative copy) is waited for, then counted and published once:
    the publish's check and its copy see the same rows. (Without the stage's lock the check
    ran at once; an attempt committing between the check and the copy was copied twice.)"""
    import psycopg

    url = postgres_url
    store = open_store(url)
    try:
        columns = store.create_tables("t", [("id", "BIGINT")])
        store.begin_staged_write(Write("w1", "t", "job"), [("id", "BIGINT")])
        stage = write_stage_table("w1")
        once = [(i, 5, i) for i in range(3)]
        insert = f"INSERT INTO {stage} (id, pidctl_producer_id, pidctl_sequence) VALUES"
        store.connection.cursor().executemany(f"{insert} (%s, %s, %s)", once)
        store.connection.commit()
        with psycopg.connect(url) as late:
            late.cursor().executemany(f"{insert} (%s, %s, %s)", once)  # not committed yet
            published: list[Any] = []
            publishing = threading.Thread(
                target=lambda: published.append(store.publish_stage("w1", "t", columns, 0))
            )
            publishing.start()
            with psycopg.connect(url, autocommit=True) as watcher:
                wait_until(
                    lambda: (
                        watcher.execute(
                            "SELECT COUNT(*) FROM pg_locks WHERE NOT granted AND mode = 'ShareLock'"
                            " AND relation = %s::regclass",
                            (stage,),
                        ).fetchone()
                        == (1,)
                    ),
                    timeout=30,
                    what="the publish waiting for the attempt still staging",
                )
            assert not published
            late.commit()
        publishing.join(timeout=60)
        ((outcome,),) = [published]
        assert (outcome.state, outcome.rows) == (WriteState.COMMITTED, 3)
        store.connection.commit()
        rows = store.execute("SELECT id, pidctl_sequence FROM t ORDER BY id").fetchall()
        assert rows == [(0, 0), (1, 1), (2, 2)]
        assert store.execute("SELECT duplicate_rows FROM pidctl_sink_commits").fetchall() == [(3,)]
    finally:
        store.close()


def test_a_lower_version_losing_a_race_fails_naming_the_winner(
    spark: Any, pidctl: ServerProcess, postgres_url: str, tmp_path: Path
) -> None:
    """Version 1 starts first and is held in its task; version 2 starts later and commits;
    version 1's job then fails (nothing published) with Delta's kind of error. (The data
    source's publish loses its races the same way: test_sqlstore.py, both databases.)"""
    url = postgres_url
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    gate = tmp_path / "gate"

    def held(value: int) -> int:
        deadline = time.monotonic() + 300
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return value

    hold = F.udf(held, LongType())
    options = {"bootstrap": pidctl.bootstrap, "url": url, "table": "events", "txnAppId": "app"}
    slow = spark.range(0, 100, 1, 1).select(hold("id").alias("id"), F.lit("v1").alias("name"))
    outcome: dict[str, Any] = {}

    def version_1() -> None:
        try:
            outcome["v1"] = write_sql(slow, txnVersion=1, **options)
        except Exception as e:
            outcome["v1"] = e

    first = threading.Thread(target=version_1)
    first.start()

    def registered() -> bool:
        try:
            found = query(url, "SELECT COUNT(*) FROM pidctl_sink_writes WHERE app_version = 1")
        except Exception:  # the sink's tables are not there yet
            return False
        return found == [(1,)]

    wait_until(registered, "version 1 registered", 120)
    second = write_sql(_source(spark, 10, 1), txnVersion=2, **options)
    gate.touch()
    first.join(300)
    assert isinstance(outcome["v1"], ConcurrentWriteError), outcome
    assert f"lost a race: write {second.write_id} committed version 2 of app to events" in str(
        outcome["v1"]
    )
    assert query(url, "SELECT COUNT(*), MIN(name) FROM events") == [(10, "row-0")]
    assert _stages_left(url) == []


@pytest.fixture(autouse=True)
def _no_job_group(spark: Any) -> Iterator[None]:
    yield
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
