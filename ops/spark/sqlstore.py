"""The exactly-once sink's database side: SQLite (a file, the embedded default) or PostgreSQL.

Every batch is applied in one database transaction together with its producer's sequence
state, so a batch is either fully in the table with its state advanced, or not at all.
Tables (created once, by the driver, before any task):

- the target table: the DataFrame's columns plus ``pidctl_producer_id`` and
  ``pidctl_sequence`` (which producer wrote the row, at which sequence: the audit trail, and
  what ``abort()`` deletes by);
- ``pidctl_producer_state``: per producer id its epoch and the first and last sequence of the
  last batch applied;
- ``pidctl_aborted_ranges``: producer-id ranges of aborted jobs (late attempts are refused);
- ``pidctl_sink_commits``: per committed job and producer, the final sequence and row counts.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pidctl.spark.sequencing import Decision, SequenceError, StoredProducer, decide

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: Seconds SQLite waits for another writer's transaction (a concurrent attempt) to finish.
SQLITE_BUSY_TIMEOUT_S = 60.0


def check_identifier(name: str) -> str:
    """Table and column names are used in SQL text: letters, digits and underscores only."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return name


@dataclass(frozen=True, slots=True)
class ProducerReport:
    """What one task (one producer) did, and what ``commit()`` records."""

    partition: int
    producer_id: int
    producer_epoch: int
    final_sequence: int
    rows_written: int
    duplicate_rows: int


class SqlStore:
    """One connection to the sink's database. Subclasses set the dialect."""

    placeholder = "?"
    row_lock = ""
    bool_true = "1"
    types: dict[str, str] = {}

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def close(self) -> None:
        self.connection.close()

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        """One statement (``?`` placeholders in every dialect); returns the cursor."""
        cursor = self.connection.cursor()
        cursor.execute(sql.replace("?", self.placeholder), parameters)
        return cursor

    def create_tables(self, table: str, columns: Sequence[tuple[str, str]]) -> None:
        """The target table (if missing) and pidctl's own tables; columns are (name, type
        from :attr:`types`)."""
        check_identifier(table)
        declared = ", ".join(f"{check_identifier(name)} {kind}" for name, kind in columns)
        statements = [
            f"CREATE TABLE IF NOT EXISTS {table} ({declared}, "
            "pidctl_producer_id BIGINT NOT NULL, pidctl_sequence INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS pidctl_producer_state (producer_id BIGINT PRIMARY KEY,"
            " table_name TEXT NOT NULL, producer_epoch INTEGER NOT NULL,"
            " last_batch_first_sequence INTEGER NOT NULL, last_sequence INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS pidctl_aborted_ranges (first_producer_id BIGINT NOT NULL,"
            " last_producer_id BIGINT NOT NULL, job TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS pidctl_sink_commits (job TEXT NOT NULL, table_name TEXT"
            " NOT NULL, producer_id BIGINT NOT NULL, producer_epoch INTEGER NOT NULL,"
            " final_sequence INTEGER NOT NULL, rows_written BIGINT NOT NULL,"
            " duplicate_rows BIGINT NOT NULL, committed_at DOUBLE PRECISION NOT NULL)",
        ]
        for sql in statements:
            self.execute(sql)
        self.connection.commit()

    def begin(self) -> None:
        """Start a write transaction (SQLite takes its write lock at once)."""

    def apply_batch(
        self,
        table: str,
        columns: Sequence[str],
        producer_id: int,
        epoch: int,
        first_sequence: int,
        rows: Sequence[Sequence[Any]],
    ) -> Decision:
        """Insert ``rows`` (sequences ``first_sequence``...) and advance the producer's state,
        in one transaction, unless the batch is a duplicate; raise SequenceError on a gap."""
        last_sequence = first_sequence + len(rows) - 1
        try:
            self.begin()
            aborted = self.execute(
                "SELECT job FROM pidctl_aborted_ranges WHERE ? BETWEEN first_producer_id AND "
                "last_producer_id",
                (producer_id,),
            ).fetchone()
            if aborted is not None:
                raise SequenceError(f"producer {producer_id}: job {aborted[0]} was aborted")
            self.execute(
                "INSERT INTO pidctl_producer_state VALUES (?, ?, ?, -1, -1) "
                "ON CONFLICT (producer_id) DO NOTHING",
                (producer_id, table, epoch),
            )
            row = self.execute(
                "SELECT producer_epoch, last_batch_first_sequence, last_sequence FROM "
                f"pidctl_producer_state WHERE producer_id = ?{self.row_lock}",
                (producer_id,),
            ).fetchone()
            stored = StoredProducer(*row) if row[2] >= 0 else None
            decision = decide(stored, producer_id, epoch, first_sequence, len(rows))
            if decision is Decision.APPEND:
                names = [*map(check_identifier, columns), "pidctl_producer_id", "pidctl_sequence"]
                marks = ", ".join([self.placeholder] * len(names))
                cursor = self.connection.cursor()
                cursor.executemany(
                    f"INSERT INTO {check_identifier(table)} ({', '.join(names)}) VALUES ({marks})",
                    [(*r, producer_id, first_sequence + i) for i, r in enumerate(rows)],
                )
                self.execute(
                    "UPDATE pidctl_producer_state SET producer_epoch = ?, "
                    "last_batch_first_sequence = ?, last_sequence = ? WHERE producer_id = ?",
                    (epoch, first_sequence, last_sequence, producer_id),
                )
            self.connection.commit()
            return decision
        except BaseException:
            self.connection.rollback()
            raise

    def abort_job(self, table: str, job: str, blocks: Sequence[tuple[int, int]]) -> int:
        """Delete every row the job's producers wrote and refuse their later batches; returns
        how many rows were deleted."""
        try:
            self.begin()
            deleted = 0
            for first, length in blocks:
                last = first + length - 1
                self.execute(
                    "INSERT INTO pidctl_aborted_ranges VALUES (?, ?, ?)", (first, last, job)
                )
                cursor = self.execute(
                    f"DELETE FROM {check_identifier(table)} WHERE pidctl_producer_id BETWEEN ? "
                    "AND ?",
                    (first, last),
                )
                deleted += max(0, cursor.rowcount)
            self.connection.commit()
            return deleted
        except BaseException:
            self.connection.rollback()
            raise

    def record_commit(self, job: str, table: str, reports: Sequence[ProducerReport]) -> None:
        """One row per producer of a committed job."""
        now = time.time()
        cursor = self.connection.cursor()
        marks = ", ".join([self.placeholder] * 8)
        cursor.executemany(
            f"INSERT INTO pidctl_sink_commits VALUES ({marks})",
            [
                (
                    job,
                    table,
                    r.producer_id,
                    r.producer_epoch,
                    r.final_sequence,
                    r.rows_written,
                    r.duplicate_rows,
                    now,
                )
                for r in reports
            ],
        )
        self.connection.commit()


class SqliteStore(SqlStore):
    types = {
        "long": "BIGINT",
        "integer": "INTEGER",
        "short": "INTEGER",
        "byte": "INTEGER",
        "string": "TEXT",
        "double": "REAL",
        "float": "REAL",
        "boolean": "INTEGER",
        "binary": "BLOB",
        "date": "TEXT",
        "timestamp": "TEXT",
        "decimal": "NUMERIC",
    }

    def __init__(self, path: str) -> None:
        connection = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")  # readers never block the writers
        connection.execute("PRAGMA synchronous=FULL")
        super().__init__(_SqliteAutocommit(connection))

    def begin(self) -> None:
        # BEGIN IMMEDIATE: the write lock before the state is read, so two attempts of one
        # partition cannot both read the same last sequence.
        self.connection.raw.execute("BEGIN IMMEDIATE")


class _SqliteAutocommit:
    """sqlite3 in autocommit mode with explicit BEGIN; commit/rollback outside a transaction
    (the DDL) are no-ops."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.raw = connection

    def cursor(self) -> sqlite3.Cursor:
        return self.raw.cursor()

    def commit(self) -> None:
        if self.raw.in_transaction:
            self.raw.execute("COMMIT")

    def rollback(self) -> None:
        if self.raw.in_transaction:
            self.raw.execute("ROLLBACK")

    def close(self) -> None:
        self.raw.close()


class PostgresStore(SqlStore):
    placeholder = "%s"
    row_lock = " FOR UPDATE"  # the state row locked until commit: attempts take turns
    types = {
        "long": "BIGINT",
        "integer": "INTEGER",
        "short": "SMALLINT",
        "byte": "SMALLINT",
        "string": "TEXT",
        "double": "DOUBLE PRECISION",
        "float": "REAL",
        "boolean": "BOOLEAN",
        "binary": "BYTEA",
        "date": "DATE",
        "timestamp": "TIMESTAMPTZ",
        "decimal": "NUMERIC",
    }

    def __init__(self, url: str) -> None:
        import psycopg

        super().__init__(psycopg.connect(url))


def open_store(url: str) -> SqlStore:
    """``postgresql://...`` (or ``postgres://``) for PostgreSQL; ``sqlite:///PATH`` or a plain
    file path for SQLite."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else url
    if not path or path.startswith("//"):
        raise ValueError(f"sink url {url!r}: expected sqlite:///PATH, a path or postgresql://")
    return SqliteStore(path)
