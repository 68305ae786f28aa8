"""A driver killed with SIGKILL mid-write leaves nothing a reader can see, its leftovers are
removed without a manual step, and a re-run with the same txnAppId/txnVersion writes every
row exactly once; a reader polling the table never sees part of a write.

The killed driver is a process of its own (tests/ops/spark/crash_driver.py); the re-runs use
the session's SparkSession, as a scheduler re-running the job would start a fresh driver."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ops.testing.serverproc import ServerProcess, kill_group_when
from pidctl.spark.sink import PidctlSqlSink
from pidctl.spark.sqlstore import open_store, stage_table

ROOT = Path(__file__).resolve().parents[3]
ROWS, PARTITIONS, HANG_AFTER = 4000, 2, 500  # local[2]: both tasks run at once

pytestmark = pytest.mark.slow


def _driver(pidctl: ServerProcess, url: str, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.ops.spark.crash_driver"]
    command += ["--bootstrap", pidctl.bootstrap, "--url", url, "--table", "events"]
    command += ["--rows", str(ROWS), "--partitions", str(PARTITIONS), *args]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the JVM and its Python workers
    )


def _count(url: str, sql: str) -> int:
    store = open_store(url)
    try:
        return int(store.execute(sql).fetchone()[0])
    finally:
        store.close()


def _table_count(url: str) -> int:
    """The rows a reader sees in the table (0 before the first write created it)."""
    try:
        return _count(url, "SELECT COUNT(*) FROM events")
    except Exception as e:
        if "events" not in str(e):
            raise
        return 0


class Reader:
    """Polls ``SELECT COUNT(*)`` of the table in a thread; remembers every count seen."""

    def __init__(self, url: str) -> None:
        self.url, self.seen, self.stop = url, set[int](), threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.wait(0.005):  # a pause: the session's own threads need the GIL
            self.seen.add(_table_count(self.url))

    def __enter__(self) -> Reader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _staged(url: str) -> int:
    try:
        return _count(url, f"SELECT COUNT(*) FROM {stage_table('events')}")
    except Exception as e:
        if stage_table("events") not in str(e):
            raise
        return 0


def _kill_mid_write(pidctl: ServerProcess, url: str, *args: str) -> None:
    """Start a write whose tasks hang after staging HANG_AFTER rows each; SIGKILL the whole
    driver once every task has staged them."""
    driver = _driver(pidctl, url, "--hang-after", str(HANG_AFTER), *args)
    kill_group_when(
        driver, lambda: _staged(url) >= PARTITIONS * HANG_AFTER, "every task staged its rows", 240
    )


def _rows(url: str) -> list[tuple[Any, ...]]:
    store = open_store(url)
    try:
        return sorted(tuple(r) for r in store.execute("SELECT id, name FROM events").fetchall())
    finally:
        store.close()


def _rerun(spark: Any, pidctl: ServerProcess, url: str, **options: str) -> None:
    """The crash driver's job, finished, in this process's session."""
    df = spark.range(0, ROWS, 1, PARTITIONS).selectExpr("id", "concat('row-', id) AS name")
    writer = df.write.format("pidctl-sql").mode("append")
    settings = {"bootstrap": pidctl.bootstrap, "url": url, "table": "events", **options}
    for name, value in {"partitions": str(PARTITIONS), "batchSize": "100", **settings}.items():
        writer = writer.option(name, value)
    writer.save()


@pytest.fixture
def reader(url: str) -> Iterator[Reader]:
    with Reader(url) as polling:
        yield polling


def test_a_killed_driver_is_replaced_by_its_rerun_and_readers_never_see_part_of_it(
    spark: Any,
    pidctl: ServerProcess,
    url: str,
    reader: Reader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    txn = {"txnAppId": "nightly", "txnVersion": "7"}
    _kill_mid_write(pidctl, url, "--txn-app", "nightly", "--txn-version", "7")
    assert _count(url, "SELECT COUNT(*) FROM events") == 0
    assert _count(url, "SELECT COUNT(*) FROM pidctl_sink_writes WHERE state = 'open'") == 1

    _rerun(spark, pidctl, url, **txn)
    assert _rows(url) == [(i, f"row-{i}") for i in range(ROWS)]
    assert _count(url, f"SELECT COUNT(*) FROM {stage_table('events')}") == 0
    superseded = "SELECT COUNT(*) FROM pidctl_sink_writes WHERE reason LIKE 'superseded by%'"
    assert _count(url, superseded) == 1

    # The same version once more: nothing is written, and the sink says so.
    _rerun(spark, pidctl, url, **txn)
    assert len(_rows(url)) == ROWS
    options = {"bootstrap": pidctl.bootstrap, "url": url, "table": "events", **txn}
    schema = spark.range(1).selectExpr("id", "'x' AS name").schema
    with caplog.at_level("WARNING", logger="pidctl.spark"):
        writer = PidctlSqlSink(options).writer(schema, False)
    said = "version 7 of nightly was committed by write"
    assert writer.skipped is not None and said in writer.skipped
    assert said in caplog.text and "writes nothing" in caplog.text
    store = open_store(url)
    try:
        assert store.committed_versions("events") == {"nightly": 7}
    finally:
        store.close()
    reader.stop.set()
    reader.thread.join(30)
    assert reader.seen <= {0, ROWS} and ROWS in reader.seen


def test_the_next_write_removes_what_a_killed_driver_left(
    spark: Any, pidctl: ServerProcess, url: str, reader: Reader
) -> None:
    _kill_mid_write(pidctl, url)
    assert _count(url, f"SELECT COUNT(*) FROM {stage_table('events')}") == PARTITIONS * HANG_AFTER
    # The next write to the table, told that a write quiet for 0 s is abandoned (nothing
    # else runs here), removes the leftovers before it writes.
    _rerun(spark, pidctl, url, abandonedAfterSeconds="0")
    assert _rows(url) == [(i, f"row-{i}") for i in range(ROWS)]
    assert _count(url, f"SELECT COUNT(*) FROM {stage_table('events')}") == 0
    abandoned = "SELECT COUNT(*) FROM pidctl_sink_writes WHERE reason LIKE 'abandoned%'"
    assert _count(url, abandoned) == 1
    reader.stop.set()
    reader.thread.join(30)
    assert reader.seen <= {0, ROWS}
