"""The sink's database side on SQLite and PostgreSQL: staging, publishing, aborts, re-runs
and recovery, each shown on a real database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ops.testing.serverproc import wait_until
from pidctl.spark.sequencing import Decision, SequenceError
from pidctl.spark.sqlstore import (
    ProducerReport,
    SqlStore,
    Write,
    WriteAborted,
    WriteState,
    open_store,
    stage_table,
)

COLUMNS = ["id", "name"]


@pytest.fixture
def store(url: str) -> Iterator[SqlStore]:
    opened = open_store(url)
    opened.create_tables("t", [("id", "BIGINT"), ("name", "TEXT")])
    yield opened
    opened.close()


def _rows(store: SqlStore, table: str = "t") -> list[tuple[Any, ...]]:
    cursor = store.execute(f"SELECT id, name, pidctl_producer_id, pidctl_sequence FROM {table}")
    rows = sorted(tuple(r) for r in cursor.fetchall())
    store.connection.commit()
    return rows


def _staged(store: SqlStore) -> int:
    count = int(store.execute(f"SELECT COUNT(*) FROM {stage_table('t')}").fetchone()[0])
    store.connection.commit()
    return count


def _state(store: SqlStore, write_id: str) -> tuple[str, str | None]:
    row = store.execute(
        "SELECT state, reason FROM pidctl_sink_writes WHERE write_id = ?", (write_id,)
    ).fetchone()
    store.connection.commit()
    return row[0], row[1]


def _report(write_id: str, producer_id: int, final: int, written: int = 0) -> ProducerReport:
    return ProducerReport(write_id, 0, producer_id, 0, final, written, 0)


def test_batches_are_staged_once_and_published_together(store: SqlStore) -> None:
    assert store.begin_write(Write("w1", "t", "job")).state is WriteState.OPEN
    batch = [(1, "a"), (2, "b")]
    assert store.apply_batch("w1", "t", COLUMNS, 42, 0, 0, batch) is Decision.APPEND
    assert store.apply_batch("w1", "t", COLUMNS, 42, 0, 0, batch) is Decision.DUPLICATE
    with pytest.raises(SequenceError, match="refusing a gap"):
        store.apply_batch("w1", "t", COLUMNS, 42, 0, 5, [(9, "gap")])
    assert store.apply_batch("w1", "t", COLUMNS, 42, 0, 2, [(3, "c")]) is Decision.APPEND
    assert store.apply_batch("w1", "t", COLUMNS, 43, 0, 0, [(4, "d")]) is Decision.APPEND
    assert _rows(store) == []  # nothing visible before the commit
    outcome = store.publish("w1", "t", COLUMNS, [_report("w1", 42, 2), _report("w1", 43, 0)])
    assert (outcome.state, outcome.rows) == (WriteState.COMMITTED, 4)
    assert _rows(store) == [(1, "a", 42, 0), (2, "b", 42, 1), (3, "c", 42, 2), (4, "d", 43, 0)]
    assert _staged(store) == 0
    # A straggling attempt after the commit: its rows are in the table already.
    assert store.apply_batch("w1", "t", COLUMNS, 42, 0, 0, batch) is Decision.DUPLICATE
    # Committing again changes nothing.
    assert store.publish("w1", "t", COLUMNS, []).state is WriteState.COMMITTED
    assert len(_rows(store)) == 4


def test_a_failed_batch_leaves_nothing(store: SqlStore) -> None:
    store.begin_write(Write("w1", "t", "job"))
    # The second row has a value too many: the insert fails after the first row went in.
    with pytest.raises(Exception):  # noqa: B017 - each driver has its own error type
        store.apply_batch("w1", "t", COLUMNS, 42, 0, 0, [(1, "a"), (2, "b", "extra")])
    assert _staged(store) == 0
    # Neither the rows nor the state moved: the batch can be applied as it should have been.
    assert store.apply_batch("w1", "t", COLUMNS, 42, 0, 0, [(1, "a")]) is Decision.APPEND


def test_publishing_checks_the_staged_rows_against_the_reports(store: SqlStore) -> None:
    store.begin_write(Write("w1", "t", "job"))
    store.apply_batch("w1", "t", COLUMNS, 42, 0, 0, [(1, "a"), (2, "b")])
    with pytest.raises(RuntimeError, match="do not match the tasks' reports"):
        store.publish("w1", "t", COLUMNS, [_report("w1", 42, 2)])  # one row missing
    with pytest.raises(RuntimeError, match="do not match"):
        store.publish("w1", "t", COLUMNS, [])  # a producer nobody reported
    assert _rows(store) == [] and _staged(store) == 2
    assert store.publish("w1", "t", COLUMNS, [_report("w1", 42, 1)]).rows == 2


def test_abort_removes_the_staged_rows_and_refuses_late_batches(store: SqlStore) -> None:
    store.begin_write(Write("other", "t", "job"))
    store.apply_batch("other", "t", COLUMNS, 5000, 0, 0, [(1, "other job")])
    store.begin_write(Write("w1", "t", "job"))
    store.apply_batch("w1", "t", COLUMNS, 9001, 0, 0, [(2, "a"), (3, "b")])
    assert store.abort("w1", "t", "the Spark job failed") is True
    assert store.abort("w1", "t", "again") is False
    assert _staged(store) == 1  # the other write's row
    assert _state(store, "w1") == ("aborted", "the Spark job failed")
    with pytest.raises(WriteAborted, match="w1 was aborted"):
        store.apply_batch("w1", "t", COLUMNS, 9001, 0, 2, [(4, "late")])
    with pytest.raises(WriteAborted):
        store.publish("w1", "t", COLUMNS, [_report("w1", 9001, 1)])
    assert _rows(store) == []


def test_a_committed_version_skips_later_runs_and_a_failed_one_is_replaced(
    store: SqlStore,
) -> None:
    first = Write("run-1", "t", "job", "nightly", 7)
    assert store.begin_write(first).state is WriteState.OPEN
    store.apply_batch("run-1", "t", COLUMNS, 1, 0, 0, [(1, "crashed")])
    # The re-run of version 7 replaces the crashed run: its staged rows go, it is fenced.
    assert store.begin_write(Write("run-2", "t", "job", "nightly", 7)).state is WriteState.OPEN
    assert _state(store, "run-1") == ("aborted", "superseded by the re-run run-2")
    assert _staged(store) == 0
    with pytest.raises(WriteAborted):
        store.apply_batch("run-1", "t", COLUMNS, 1, 0, 1, [(2, "zombie")])
    store.apply_batch("run-2", "t", COLUMNS, 2, 0, 0, [(1, "ok")])
    store.publish("run-2", "t", COLUMNS, [_report("run-2", 2, 0)])
    # Version 7 again, or an older one: skipped, and said why.
    for write_id, version in (("run-3", 7), ("run-4", 6)):
        outcome = store.begin_write(Write(write_id, "t", "job", "nightly", version))
        assert outcome.state is WriteState.SKIPPED
        assert "version 7 of nightly was committed by write run-2" in outcome.reason
    assert store.begin_write(Write("run-5", "t", "job", "nightly", 8)).state is WriteState.OPEN
    assert store.committed_versions("t") == {"nightly": 7}
    assert store.committed_version("t", "nightly") == (7, "run-2")
    assert store.committed_version("t", "other") is None
    assert _rows(store) == [(1, "ok", 2, 0)]


def _register_open(store: SqlStore, write_id: str, app: str, version: int) -> None:
    """A write registered before another committed (a race between begin and commit)."""
    store.execute(
        "INSERT INTO pidctl_sink_writes (write_id, table_name, job, app_id, app_version, state,"
        " started_at) VALUES (?, 't', 'job', ?, ?, 'open', 0)",
        (write_id, app, version),
    )
    store.connection.commit()


def test_a_run_losing_a_race_publishes_nothing_and_names_the_winner(store: SqlStore) -> None:
    """Delta Lake's ConcurrentTransactionException: a write whose app id committed this
    version (a twin run) or a later one (version 2 started later, committed first) while it
    ran ends aborted, and the outcome names the winner."""
    for run in ("a", "b"):
        store.begin_write(Write(run, "t", "job", "app", 1))  # b supersedes a...
    assert _state(store, "a")[0] == "aborted"  # ...which is fenced
    _register_open(store, "c", "app", 1)  # the same version, registered before b commits
    _register_open(store, "v0", "app", 0)  # an older version, started before b
    store.apply_batch("b", "t", COLUMNS, 2, 0, 0, [(1, "b")])
    assert store.publish("b", "t", COLUMNS, [_report("b", 2, 0)]).state is WriteState.COMMITTED
    for loser, producer, version in (("c", 3, 1), ("v0", 4, 0)):
        store.apply_batch(loser, "t", COLUMNS, producer, 0, 0, [(9, loser)])
        outcome = store.publish(loser, "t", COLUMNS, [_report(loser, producer, 0)])
        assert outcome.state is WriteState.ABORTED
        assert outcome.reason == (
            f"write {loser} (version {version} of app) lost a race: write b committed version 1"
            " of app to t while it ran; nothing of this write is published"
        )
        assert _state(store, loser) == ("aborted", outcome.reason)
    assert _rows(store) == [(1, "b", 2, 0)] and _staged(store) == 0


def test_recovery_removes_abandoned_writes_only(store: SqlStore) -> None:
    store.begin_write(Write("crashed", "t", "job"))
    store.apply_batch("crashed", "t", COLUMNS, 1, 0, 0, [(1, "left behind")])
    assert store.recover("t", 3600) == []  # it might still be running
    assert _staged(store) == 1
    assert store.recover("t", 0) == ["crashed"]
    assert _staged(store) == 0
    assert _state(store, "crashed") == ("aborted", "abandoned: no batch for 0 s")


def test_a_batch_in_flight_cannot_survive_an_abort(store: SqlStore, url: str) -> None:
    """Issue 15's residue: a batch that began before the abort commits after it. Here the
    batch's transaction is held open just before its commit while the abort runs."""
    store.begin_write(Write("w1", "t", "job"))
    at_commit, release = threading.Event(), threading.Event()
    outcomes: dict[str, Any] = {}

    def run_batch() -> None:
        batch_store = open_store(url)  # SQLite connections stay in their thread
        real_commit = batch_store.connection.commit

        def paused_commit() -> None:
            at_commit.set()
            release.wait(60)
            real_commit()

        batch_store.connection.commit = paused_commit
        try:
            outcomes["batch"] = batch_store.apply_batch(
                "w1", "t", COLUMNS, 7, 0, 0, [(i, "in flight") for i in range(1000)]
            )
        except Exception as e:
            outcomes["batch"] = e
        finally:
            at_commit.set()
            batch_store.close()

    def run_abort() -> None:
        abort_store = open_store(url)
        try:
            outcomes["abort"] = abort_store.abort("w1", "t", "the Spark job failed")
        finally:
            abort_store.close()

    batch = threading.Thread(target=run_batch)
    batch.start()
    assert at_commit.wait(60)
    aborting = threading.Thread(target=run_abort)
    aborting.start()
    # The abort waits for the batch: on the write's row lock in PostgreSQL (seen in pg_locks),
    # on the database's write lock in SQLite (not observable: the abort is given a moment).
    _wait_blocked(store, aborting)
    release.set()
    batch.join(60)
    aborting.join(60)
    assert outcomes == {"batch": Decision.APPEND, "abort": True}
    assert _staged(store) == 0 and _rows(store) == []
    with pytest.raises(WriteAborted):
        store.apply_batch("w1", "t", COLUMNS, 7, 0, 1000, [(1, "after")])


def _wait_blocked(store: SqlStore, thread: threading.Thread) -> None:
    if store.dialect == "postgresql":

        def waiting() -> bool:
            row = store.execute("SELECT COUNT(*) FROM pg_locks WHERE NOT granted").fetchone()
            store.connection.commit()
            return int(row[0]) > 0

        wait_until(waiting, "the abort waits for the batch's lock", 30)
    else:
        thread.join(0.5)
    assert thread.is_alive(), "the abort did not wait for the batch in flight"


def test_staging_connections_do_not_sync_each_batch_and_the_publish_does(url: str) -> None:
    """A task's batches need not reach the disk one by one (the publish checks the states and
    syncs everything before it); every other connection commits durably."""
    staging, publishing = open_store(url), open_store(url)
    try:
        staging.stage_without_syncing()
        relaxed: tuple[object, ...]
        durable: tuple[object, ...]
        if staging.dialect == "sqlite":
            query, relaxed, durable = "PRAGMA synchronous", (1,), (2,)  # NORMAL, FULL
        else:
            query, relaxed, durable = "SHOW synchronous_commit", ("off",), ("on",)
        assert tuple(staging.execute(query).fetchone()) == relaxed
        assert tuple(publishing.execute(query).fetchone()) == durable
    finally:
        staging.close()
        publishing.close()


def test_a_drivers_heartbeat_keeps_a_quiet_write_from_being_taken_for_abandoned(
    store: SqlStore,
) -> None:
    """write_sql's tasks stage through Spark's JDBC writer and leave no batches the recovery
    could see: the driver's beats are the write's sign of life."""
    store.begin_write(Write("long-job", "t", "job"))
    store.execute("UPDATE pidctl_sink_writes SET started_at = 0 WHERE write_id = 'long-job'")
    store.connection.commit()
    assert store.beat("long-job") is True
    assert store.recover("t", 60) == []  # started long ago, but its driver is alive
    store.execute("UPDATE pidctl_sink_producers SET updated_at = 0")  # the driver died
    store.connection.commit()
    assert store.recover("t", 60) == ["long-job"]
    assert store.beat("long-job") is False  # ended: no beat revives it
    count = store.execute("SELECT COUNT(*) FROM pidctl_sink_producers").fetchone()[0]
    store.connection.commit()
    assert count == 0
