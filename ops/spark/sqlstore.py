"""The exactly-once sink's database side: SQLite (a file, the embedded default) or PostgreSQL.

A write (one batch job, or one micro-batch of a stream) is staged, then published:

- tasks apply their batches to the staging table ``pidctl_stage_<table>``, each batch in one
  database transaction with its producer's sequence state (Kafka's rules: a retried or
  speculative attempt's batches are duplicates and skipped);
- the commit publishes the write in one transaction: checks that every producer's staged
  sequences end where its task reported (its state says so: rows are staged only with it),
  copies the rows into the user's table, deletes them from the stage and marks the write
  committed. Readers of the user's table see all of a
  write's rows or none of them;
- an abort, a superseding re-run (same ``txnAppId``/``txnVersion``) or the recovery of an
  abandoned write deletes the write's staged rows and marks it aborted; a batch that was in
  flight cannot survive it (the batch holds the write's row in ``FOR SHARE`` mode, the abort
  takes it ``FOR UPDATE`` and finds the write no longer open).

Tables (created by the driver before any task):

- the user's table: the DataFrame's columns (types: ``pidctl.spark.types``) plus
  ``pidctl_producer_id`` and ``pidctl_sequence`` (the granted producer id and the sequence
  that wrote the row: the audit trail);
- ``pidctl_stage_<table>``: the same columns plus ``pidctl_write_id``; empty between writes;
- ``pidctl_sink_writes``: one row per write: id, table, job (client id), ``app_id`` and
  ``app_version`` (``txnAppId``/``txnVersion``, or the query id and batch id of a stream),
  state (open, committed, aborted, skipped), reason, times and rows published;
- ``pidctl_sink_producers``: per write and producer id, its epoch, the first and last
  sequence of the last batch applied, and when (what tells a live write from an abandoned
  one); removed when the write ends;
- ``pidctl_sink_commits``: per committed write and producer, the final sequence, the rows it
  wrote and the duplicate rows it skipped;
- the view ``pidctl_sink_versions``: per table and app id, the highest committed version.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Concatenate, ParamSpec, TypeVar

from pidctl.spark.sequencing import Decision, StoredProducer, decide

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: Seconds SQLite waits for another writer's transaction (a concurrent attempt) to finish.
SQLITE_BUSY_TIMEOUT_S = 60.0
#: PostgreSQL's identifiers are at most 63 bytes; longer table names get a hashed stage name.
_STAGE_PREFIX = "pidctl_stage_"
_MAX_IDENTIFIER = 63
#: The columns the sink adds to the user's table.
AUDIT_COLUMNS = ("pidctl_producer_id", "pidctl_sequence")

log = logging.getLogger("pidctl.spark")


def check_identifier(name: str) -> str:
    """Table and column names are used in SQL text: letters, digits and underscores only."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def _literal(text: str) -> str:
    """``text`` as an SQL string literal (quotes doubled): for values the sink made itself."""
    return "'" + text.replace("'", "''") + "'"


def stage_table(table: str) -> str:
    """The staging table of ``table``: ``pidctl_stage_<table>``, or a hash of the name when
    that would exceed 63 characters."""
    check_identifier(table)
    name = _STAGE_PREFIX + table
    if len(name) > _MAX_IDENTIFIER:
        name = _STAGE_PREFIX + hashlib.sha256(table.encode()).hexdigest()[:32]
    return name


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_transaction(
    method: Callable[Concatenate[SqlStore, _P], _R],
) -> Callable[Concatenate[SqlStore, _P], _R]:
    """Run ``method`` in one database transaction: committed if it returns, rolled back if
    it raises."""

    def run(store: SqlStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            store.begin()
            result = method(store, *args, **kwargs)
            store.connection.commit()
            return result
        except BaseException:
            store.connection.rollback()
            raise

    functools.update_wrapper(run, method)  # its name and docstring
    return run


class WriteState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    SKIPPED = "skipped"  # its (app id, version) had already been committed


class WriteAborted(RuntimeError):
    """The write was aborted (failed, superseded by a re-run, or abandoned) before it could
    be published; nothing of it is in the user's table."""


@dataclass(frozen=True, slots=True)
class Write:
    """What identifies a write. ``app_id``/``app_version``: Delta Lake's ``txnAppId`` and
    ``txnVersion`` (a stream: its query id and batch id); None for a write without them."""

    write_id: str
    table: str
    job: str
    app_id: str | None = None
    app_version: int | None = None


@dataclass(frozen=True, slots=True)
class ProducerReport:
    """What one task (one producer) did, and what the commit records. ``rows_written``: the
    rows this attempt staged (its published rows once committed); ``duplicate_rows``: rows
    it skipped because an earlier attempt of the partition had staged them."""

    write_id: str
    partition: int
    producer_id: int
    producer_epoch: int
    final_sequence: int
    rows_written: int
    duplicate_rows: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a write ended: its state, the rows published, and why (for skipped or aborted)."""

    state: WriteState
    rows: int = 0
    reason: str = ""


class SqlStore:
    """One connection to the sink's database. Subclasses set the dialect."""

    dialect = ""
    placeholder = "?"
    share_lock = ""  # how a batch holds its write's row: shared with other batches
    update_lock = ""  # how a commit or abort holds it: alone
    create_view = "CREATE VIEW IF NOT EXISTS"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def close(self) -> None:
        self.connection.close()

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        """One statement (``?`` placeholders in every dialect); returns the cursor."""
        cursor = self.connection.cursor()
        if parameters:
            cursor.execute(sql.replace("?", self.placeholder), parameters)
        else:  # no parameters: psycopg then leaves a literal % alone
            cursor.execute(sql)
        return cursor

    def begin(self) -> None:
        """Start a write transaction (SQLite takes its write lock at once)."""

    def lock_schema(self) -> None:
        """Serialise table creation between concurrent drivers (PostgreSQL)."""

    def stage_without_syncing(self) -> None:
        """Let this connection's commits return before they reach the disk. For the tasks'
        staging connections only: a staged batch lost in a crash of the database takes its
        producer state with it (one transaction), so the publish finds the states short of
        the tasks' reports and refuses; the publish itself commits durably, which also makes
        every staged batch before it durable (one log, in order). It saves one sync per batch."""

    # --- the driver, before any task -------------------------------------------------------

    def create_tables(self, table: str, columns: Sequence[tuple[str, str]]) -> None:
        """The user's table and its stage (if missing) and pidctl's own tables; ``columns``
        are (name, SQL type from :mod:`pidctl.spark.types`)."""
        declared = ", ".join(f"{check_identifier(name)} {kind}" for name, kind in columns)
        audit = "pidctl_producer_id BIGINT NOT NULL, pidctl_sequence INTEGER NOT NULL"
        statements = [
            f"CREATE TABLE IF NOT EXISTS {check_identifier(table)} ({declared}, {audit})",
            f"CREATE TABLE IF NOT EXISTS {stage_table(table)} ({declared}, {audit}, "
            "pidctl_write_id TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS pidctl_sink_writes (write_id TEXT PRIMARY KEY,"
            " table_name TEXT NOT NULL, job TEXT NOT NULL, app_id TEXT, app_version BIGINT,"
            " state TEXT NOT NULL, reason TEXT, started_at DOUBLE PRECISION NOT NULL,"
            " ended_at DOUBLE PRECISION, rows_published BIGINT)",
            "CREATE INDEX IF NOT EXISTS pidctl_sink_writes_by_app ON pidctl_sink_writes"
            " (table_name, app_id, app_version)",
            "CREATE TABLE IF NOT EXISTS pidctl_sink_producers (write_id TEXT NOT NULL,"
            " producer_id BIGINT NOT NULL, producer_epoch INTEGER NOT NULL,"
            " last_batch_first_sequence INTEGER NOT NULL, last_sequence INTEGER NOT NULL,"
            " updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (write_id, producer_id))",
            "CREATE TABLE IF NOT EXISTS pidctl_sink_commits (write_id TEXT NOT NULL,"
            " job TEXT NOT NULL, table_name TEXT NOT NULL, producer_id BIGINT NOT NULL,"
            " producer_epoch INTEGER NOT NULL, final_sequence INTEGER NOT NULL,"
            " rows_written BIGINT NOT NULL, duplicate_rows BIGINT NOT NULL,"
            " committed_at DOUBLE PRECISION NOT NULL)",
            f"{self.create_view} pidctl_sink_versions AS SELECT table_name, app_id,"
            " MAX(app_version) AS version, COUNT(*) AS committed_writes FROM pidctl_sink_writes"
            " WHERE state = 'committed' AND app_id IS NOT NULL GROUP BY table_name, app_id",
        ]

        self._create(statements)

    @_one_transaction
    def _create(self, statements: list[str]) -> None:
        self.lock_schema()
        for sql in statements:
            self.execute(sql)

    def committed_version(self, table: str, app_id: str) -> tuple[int, str] | None:
        """The highest committed version of ``app_id`` on ``table`` and the write that
        committed it, or None."""
        row = self.execute(
            "SELECT app_version, write_id FROM pidctl_sink_writes WHERE table_name = ? AND "
            "app_id = ? AND state = 'committed' ORDER BY app_version DESC LIMIT 1",
            (table, app_id),
        ).fetchone()
        self.connection.commit()
        return None if row is None else (int(row[0]), str(row[1]))

    def committed_versions(self, table: str) -> dict[str, int]:
        """Per app id, the highest version committed on ``table`` (``pidctl_sink_versions``)."""
        rows = self.execute(
            "SELECT app_id, version FROM pidctl_sink_versions WHERE table_name = ?", (table,)
        ).fetchall()
        self.connection.commit()
        return {str(app): int(version) for app, version in rows}

    @_one_transaction
    def begin_write(self, write: Write) -> Outcome:
        """Register ``write`` (idempotent: every task of a stream's micro-batch calls it).

        With an app id: if that app already committed this version or a later one on the
        table, the write is skipped (Delta's rule); an open write of the same (app id,
        version) — a crashed or failed earlier run — is aborted and its staged rows removed.
        Returns the write's state."""
        now = time.time()
        if write.app_id is not None and write.app_version is not None:
            done = self.execute(
                "SELECT write_id, app_version FROM pidctl_sink_writes WHERE table_name = ? AND"
                " app_id = ? AND state = 'committed' AND app_version >= ? AND write_id <> ?"
                " ORDER BY app_version DESC LIMIT 1",
                (write.table, write.app_id, write.app_version, write.write_id),
            ).fetchone()
            if done is not None:
                reason = (
                    f"version {done[1]} of {write.app_id} was committed by write {done[0]}: "
                    f"version {write.app_version} writes nothing"
                )
                self._insert_write(write, WriteState.SKIPPED, now, reason)
                return self._state(write.write_id)
            earlier = self.execute(
                "SELECT write_id FROM pidctl_sink_writes WHERE table_name = ? AND app_id = ?"
                " AND app_version = ? AND state = 'open' AND write_id <> ?",
                (write.table, write.app_id, write.app_version, write.write_id),
            ).fetchall()
            for (write_id,) in earlier:
                self._abort(write_id, write.table, f"superseded by the re-run {write.write_id}")
        self._insert_write(write, WriteState.OPEN, now, None)
        return self._state(write.write_id)

    def _insert_write(
        self, write: Write, state: WriteState, now: float, reason: str | None
    ) -> None:
        ended = None if state is WriteState.OPEN else now
        self.execute(
            "INSERT INTO pidctl_sink_writes (write_id, table_name, job, app_id, app_version,"
            " state, reason, started_at, ended_at, rows_published)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (write_id) DO NOTHING",
            (
                write.write_id,
                write.table,
                write.job,
                write.app_id,
                write.app_version,
                state.value,
                reason,
                now,
                ended,
            ),
        )

    def _state(self, write_id: str, lock: str = "") -> Outcome:
        row = self.execute(
            "SELECT state, rows_published, reason FROM pidctl_sink_writes WHERE write_id = ?"
            + lock,
            (write_id,),
        ).fetchone()
        if row is None:
            raise WriteAborted(f"write {write_id} is unknown to this database")
        return Outcome(WriteState(row[0]), int(row[1] or 0), row[2] or "")

    @_one_transaction
    def recover(self, table: str, older_than_s: float) -> list[str]:
        """Abort every open write on ``table`` with no sign of life (its start or a batch)
        for ``older_than_s`` seconds, removing its staged rows, and any staged row of a write
        that is not open. Returns the ids of the writes aborted."""
        cutoff = time.time() - older_than_s
        stale = self.execute(
            "SELECT w.write_id FROM pidctl_sink_writes w WHERE w.table_name = ? AND"
            " w.state = 'open' AND w.started_at <= ? AND NOT EXISTS (SELECT 1 FROM"
            " pidctl_sink_producers p WHERE p.write_id = w.write_id AND p.updated_at > ?)",
            (table, cutoff, cutoff),
        ).fetchall()
        aborted = []
        for (write_id,) in stale:
            reason = f"abandoned: no batch for {older_than_s:g} s"
            if self._abort(write_id, table, reason):
                aborted.append(str(write_id))
        self.execute(
            f"DELETE FROM {stage_table(table)} WHERE pidctl_write_id NOT IN (SELECT write_id"
            " FROM pidctl_sink_writes WHERE state = 'open')"
        )
        return aborted

    # --- the tasks -------------------------------------------------------------------------

    @_one_transaction
    def apply_batch(
        self,
        write_id: str,
        table: str,
        columns: Sequence[str],
        producer_id: int,
        epoch: int,
        first_sequence: int,
        rows: Sequence[Sequence[Any]],
    ) -> Decision:
        """Stage ``rows`` (sequences ``first_sequence``...) and advance the producer's state,
        in one transaction, unless the batch is a duplicate (or its write was already
        published); raise SequenceError on a gap, WriteAborted if the write is aborted."""
        state = self._state(write_id, self.share_lock)
        if state.state in (WriteState.COMMITTED, WriteState.SKIPPED):
            return Decision.DUPLICATE  # a straggling attempt: its rows were published
        if state.state is not WriteState.OPEN:
            raise WriteAborted(f"write {write_id} was aborted ({state.reason})")
        now = time.time()
        self.execute(
            "INSERT INTO pidctl_sink_producers VALUES (?, ?, ?, -1, -1, ?) "
            "ON CONFLICT (write_id, producer_id) DO NOTHING",
            (write_id, producer_id, epoch, now),
        )
        row = self.execute(
            "SELECT producer_epoch, last_batch_first_sequence, last_sequence FROM "
            f"pidctl_sink_producers WHERE write_id = ? AND producer_id = ?{self.update_lock}",
            (write_id, producer_id),
        ).fetchone()
        stored = StoredProducer(*row) if row[2] >= 0 else None
        decision = decide(stored, producer_id, epoch, first_sequence, len(rows))
        if decision is Decision.APPEND:
            # The producer id and the write id are the same for every row of the batch: they
            # are written into the statement once instead of bound once per row.
            names = [*map(check_identifier, columns), "pidctl_sequence"]
            values = [self.placeholder] * len(names) + [str(int(producer_id)), _literal(write_id)]
            self.connection.cursor().executemany(
                f"INSERT INTO {stage_table(table)} ({', '.join(names)}, pidctl_producer_id,"
                f" pidctl_write_id) VALUES ({', '.join(values)})",
                [(*r, sequence) for sequence, r in enumerate(rows, first_sequence)],
            )
            self.execute(
                "UPDATE pidctl_sink_producers SET producer_epoch = ?, last_batch_first_sequence"
                " = ?, last_sequence = ?, updated_at = ? WHERE write_id = ? AND producer_id = ?",
                (epoch, first_sequence, first_sequence + len(rows) - 1, now, write_id, producer_id),
            )
        return decision

    # --- the driver, after the tasks -------------------------------------------------------

    @_one_transaction
    def publish(
        self, write_id: str, table: str, columns: Sequence[str], reports: Sequence[ProducerReport]
    ) -> Outcome:
        """Publish a write in one transaction (see the module documentation). An already
        committed or skipped write is left as it is; an aborted one raises WriteAborted; staged
        sequences that do not match the tasks' reports raise RuntimeError (nothing published)."""
        state = self._state(write_id, self.update_lock)
        if state.state in (WriteState.COMMITTED, WriteState.SKIPPED):
            return state
        if state.state is not WriteState.OPEN:
            raise WriteAborted(f"write {write_id} was aborted ({state.reason})")
        app = self.execute(
            "SELECT app_id, app_version FROM pidctl_sink_writes WHERE write_id = ?", (write_id,)
        ).fetchone()
        if app[0] is not None:
            done = self.execute(
                "SELECT write_id, app_version FROM pidctl_sink_writes WHERE table_name = ? AND"
                " app_id = ? AND state = 'committed' AND app_version >= ?",
                (table, app[0], app[1]),
            ).fetchone()
            if done is not None:  # a concurrent run of the same version committed first
                reason = f"version {done[1]} of {app[0]} was committed by write {done[0]}"
                self._end(write_id, table, WriteState.SKIPPED, reason)
                return self._state(write_id)
        # Rows are staged only together with their producer's state (one transaction per
        # batch), so the states say what is staged: producer id -> last sequence.
        staged = {
            int(producer): int(last)
            for producer, last in self.execute(
                "SELECT producer_id, last_sequence FROM pidctl_sink_producers WHERE write_id = ?",
                (write_id,),
            ).fetchall()
            if last >= 0
        }
        expected = {r.producer_id: r.final_sequence for r in reports if r.final_sequence >= 0}
        if staged != expected:
            raise RuntimeError(
                f"write {write_id}: staged sequences {staged} do not match the tasks' reports "
                f"{expected} (last sequence per producer); nothing published"
            )
        stage = stage_table(table)
        names = ", ".join([*map(check_identifier, columns), *AUDIT_COLUMNS])
        self.execute(
            f"INSERT INTO {check_identifier(table)} ({names}) SELECT {names} FROM {stage}"
            " WHERE pidctl_write_id = ?",
            (write_id,),
        )
        rows = sum(last + 1 for last in staged.values())
        self._end(write_id, table, WriteState.COMMITTED, None, rows)
        now = time.time()
        job = self.execute(
            "SELECT job FROM pidctl_sink_writes WHERE write_id = ?", (write_id,)
        ).fetchone()[0]
        self.connection.cursor().executemany(
            f"INSERT INTO pidctl_sink_commits VALUES ({', '.join([self.placeholder] * 9)})",
            [
                (
                    write_id,
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
        return Outcome(WriteState.COMMITTED, rows)

    @_one_transaction
    def abort(self, write_id: str, table: str, reason: str) -> bool:
        """Abort an open write: its staged rows are removed and its later batches refused.
        Returns False if it had already ended."""
        return self._abort(write_id, table, reason)

    def _abort(self, write_id: str, table: str, reason: str) -> bool:
        if self._state(write_id, self.update_lock).state is not WriteState.OPEN:
            return False
        self._end(write_id, table, WriteState.ABORTED, reason)
        return True

    def _delete_staged(self, write_id: str, table: str) -> None:
        self.execute(f"DELETE FROM {stage_table(table)} WHERE pidctl_write_id = ?", (write_id,))

    def _end(
        self, write_id: str, table: str, state: WriteState, reason: str | None, rows: int = 0
    ) -> None:
        """Mark a write ended; its staged rows and producer states go (the caller holds the
        write's row)."""
        self._delete_staged(write_id, table)
        self.execute("DELETE FROM pidctl_sink_producers WHERE write_id = ?", (write_id,))
        self.execute(
            "UPDATE pidctl_sink_writes SET state = ?, reason = ?, ended_at = ?,"
            " rows_published = ? WHERE write_id = ?",
            (state.value, reason, time.time(), rows, write_id),
        )


class SqliteStore(SqlStore):
    dialect = "sqlite"

    def _delete_staged(self, write_id: str, table: str) -> None:
        # Under SQLite's write lock, when no other write to the table is open the stage holds
        # only this write's rows: a DELETE without WHERE (SQLite's truncate) is much cheaper.
        others = self.execute(
            "SELECT 1 FROM pidctl_sink_writes WHERE table_name = ? AND state = 'open' AND"
            " write_id <> ? LIMIT 1",
            (table, write_id),
        ).fetchone()
        if others is None:
            self.execute(f"DELETE FROM {stage_table(table)}")
        else:
            super()._delete_staged(write_id, table)

    def __init__(self, path: str) -> None:
        connection = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")  # readers never block the writers
        connection.execute("PRAGMA synchronous=FULL")
        super().__init__(_SqliteAutocommit(connection))

    def stage_without_syncing(self) -> None:
        # WAL with synchronous=NORMAL: commits are not synced; a later synced commit (the
        # publish) syncs the log up to it, and a crash loses a suffix of transactions only.
        self.connection.raw.execute("PRAGMA synchronous=NORMAL")

    def begin(self) -> None:
        # BEGIN IMMEDIATE: the write lock before anything is read, so every transaction of the
        # sink (a batch, a publish, an abort) runs alone, in the order it began.
        self.connection.raw.execute("BEGIN IMMEDIATE")


class _SqliteAutocommit:
    """sqlite3 in autocommit mode with explicit BEGIN; commit/rollback outside a transaction
    are no-ops."""

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
    dialect = "postgresql"
    placeholder = "%s"
    share_lock = " FOR SHARE"
    update_lock = " FOR UPDATE"
    create_view = "CREATE OR REPLACE VIEW"

    def __init__(self, url: str) -> None:
        import psycopg

        super().__init__(psycopg.connect(url))

    def stage_without_syncing(self) -> None:
        # Asynchronous commit: a crash may lose the last transactions, never part of one;
        # the publish's synchronous commit flushes the WAL up to it, staged batches included.
        self.execute("SET synchronous_commit TO OFF")
        self.connection.commit()

    def lock_schema(self) -> None:
        # CREATE ... IF NOT EXISTS races with itself in PostgreSQL (a unique violation in
        # the catalogue); one transaction-scoped advisory lock makes concurrent drivers queue.
        self.execute("SELECT pg_advisory_xact_lock(hashtext('pidctl-sink-schema'))")


def open_store(url: str) -> SqlStore:
    """``postgresql://...`` (or ``postgres://``) for PostgreSQL; ``sqlite:///PATH`` or a plain
    file path for SQLite."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else url
    if not path or path.startswith("//"):
        raise ValueError(f"sink url {url!r}: expected sqlite:///PATH, a path or postgresql://")
    return SqliteStore(path)


def dialect_of(url: str) -> str:
    """``postgresql`` or ``sqlite``, as :func:`open_store` would open ``url``."""
    return "postgresql" if url.startswith(("postgresql://", "postgres://")) else "sqlite"
