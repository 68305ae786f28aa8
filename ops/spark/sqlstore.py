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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Concatenate, ParamSpec, TypeVar

from pidctl.spark.sequencing import Decision, StoredProducer, decide

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: Seconds SQLite waits for another writer's transaction (a concurrent attempt) to finish.
SQLITE_BUSY_TIMEOUT_S = 60.0
#: PostgreSQL's identifiers are at most 63 bytes (longer ones are cut silently, so two long
#: names could become one); longer table names get a hashed stage name.
_STAGE_PREFIX = "pidctl_stage_"
_MAX_IDENTIFIER = 63
#: The columns the sink adds to the user's table.
AUDIT_COLUMNS = ("pidctl_producer_id", "pidctl_sequence")
#: Their types, as the sink creates them.
AUDIT_TYPES = {"pidctl_producer_id": "BIGINT", "pidctl_sequence": "INTEGER"}
#: The producer id of the row a per-write stage is created with: PostgreSQL empties an
#: UNLOGGED table when it recovers from a crash, so a stage without it lost its rows.
SENTINEL_PRODUCER = -1

log = logging.getLogger("pidctl.spark")


class SchemaMismatch(ValueError):
    """The DataFrame's columns do not match the existing table's; the message names them."""


class ConcurrentWriteError(RuntimeError):
    """Delta Lake's ConcurrentTransactionException: another write of the same ``txnAppId``
    committed this version or a later one while this write ran; nothing of this write is
    published. The message names the winner."""


def check_identifier(name: str) -> str:
    """Table names are plain SQL identifiers: letters, digits and underscores (they are also
    quoted, so reserved words such as ``order`` are fine)."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def table_name(name: str) -> str:
    """The table's identity in the database: the name folded to lower case, as PostgreSQL
    folds an unquoted name (and SQLite compares names regardless of case). ``Orders``,
    ``orders`` and ``ORDERS`` are one table, and one key for ``txnAppId`` versions."""
    return check_identifier(name).lower()


def check_column(name: str) -> str:
    """A column name the sink can quote: not empty, no NUL, at most 63 bytes (PostgreSQL cuts
    longer names, so two could become one)."""
    if not name or "\0" in name or len(name.encode()) > _MAX_IDENTIFIER:
        raise ValueError(
            f"column {name!r}: a column name must be 1 to {_MAX_IDENTIFIER} bytes without NUL"
        )
    return name


def quote(name: str) -> str:
    """``name`` as a quoted SQL identifier (reserved words such as ``select`` or ``order``
    are then plain names; a quote inside is doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    """``text`` as an SQL string literal (quotes doubled): for values the sink made itself."""
    return "'" + text.replace("'", "''") + "'"


def stage_table(table: str) -> str:
    """The shared staging table of ``table`` (the Python writers'): ``pidctl_stage_<table>``
    (folded), or a hash of the name when that would exceed 63 characters."""
    name = _STAGE_PREFIX + table_name(table)
    if len(name) > _MAX_IDENTIFIER:
        name = _STAGE_PREFIX + hashlib.sha256(table_name(table).encode()).hexdigest()[:32]
    return name


def write_stage_table(write_id: str) -> str:
    """The staging table of one write through Spark's JDBC writer (:mod:`pidctl.spark.write`):
    created for it, dropped when it ends."""
    return _STAGE_PREFIX + "w" + hashlib.sha256(write_id.encode()).hexdigest()[:24]


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
    unlogged = ""  # a per-write stage's kind of table
    row_position = "rowid"  # a row's physical position, to keep one of identical copies
    stage_lock = ""  # how a publish stops late attempts staging (SQLite: it runs alone)

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

    def create_tables(self, table: str, columns: Sequence[tuple[str, str]]) -> list[str]:
        """Make the user's table and its shared stage fit ``columns`` — (name, SQL type from
        :mod:`pidctl.spark.types`) in the DataFrame's order — and create pidctl's own tables.

        A missing table is created with the columns and the audit columns. An existing one
        must have exactly the DataFrame's columns (names compared without regard to case, as
        Spark does): otherwise :class:`SchemaMismatch` names the missing and the extra ones.
        Audit columns it lacks are added (nullable: its earlier rows have none) and said so
        in a warning; the stage gains any column it lacks. Returns the columns' names as the
        table spells them, in the DataFrame's order."""
        self._create(self._sink_tables())
        return self._prepare_user_table(table, columns)

    def _sink_tables(self) -> list[str]:
        return [
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

    @_one_transaction
    def _create(self, statements: list[str]) -> None:
        self.lock_schema()
        for sql in statements:
            self.execute(sql)

    def table_columns(self, table: str) -> list[str] | None:
        """The columns of ``table`` (a name as the database knows it) in order, or None if
        there is no such table."""
        raise NotImplementedError

    @_one_transaction
    def _prepare_user_table(self, table: str, columns: Sequence[tuple[str, str]]) -> list[str]:
        self.lock_schema()
        table = table_name(table)
        names = [check_column(name) for name, _ in columns]
        folded = [name.lower() for name in names]
        twice = sorted({name for name in folded if folded.count(name) > 1})
        if twice:
            raise SchemaMismatch(
                f"table {table}: the DataFrame has columns whose names differ only in case:"
                f" {', '.join(map(repr, twice))}"
            )
        audit = [f"{quote(name)} {kind} NOT NULL" for name, kind in AUDIT_TYPES.items()]
        existing = self.table_columns(table)
        if existing is None:
            declared = [f"{quote(name)} {kind}" for name, kind in columns]
            self.execute(f"CREATE TABLE {quote(table)} ({', '.join([*declared, *audit])})")
            spelled = names
        else:
            spelled = self._match_columns(table, names, existing)
        stage = stage_table(table)
        kinds = dict(zip(spelled, [kind for _, kind in columns], strict=True))
        staged = self.table_columns(stage)
        if staged is None:
            declared = [f"{quote(name)} {kinds[name]}" for name in spelled]
            self.execute(
                f"CREATE TABLE {quote(stage)} ({', '.join([*declared, *audit])},"
                " pidctl_write_id TEXT NOT NULL)"
            )
        else:  # a column added to the table since: the stage follows (its rows get NULL)
            for name in spelled:
                if name not in staged:
                    self.execute(
                        f"ALTER TABLE {quote(stage)} ADD COLUMN {quote(name)} {kinds[name]}"
                    )
        return spelled

    def _match_columns(self, table: str, names: list[str], existing: list[str]) -> list[str]:
        """The DataFrame's ``names`` as ``table`` spells them; audit columns it lacks added."""
        by_fold = {name.lower(): name for name in existing}
        extra = [name for name in names if name.lower() not in by_fold]
        wanted = {name.lower() for name in names} | set(AUDIT_COLUMNS)
        missing = [name for name in existing if name.lower() not in wanted]
        if extra or missing:
            said = []
            if extra:
                said.append(f"the DataFrame's {', '.join(map(repr, extra))} not in the table")
            if missing:
                said.append(f"the table's {', '.join(map(repr, missing))} not in the DataFrame")
            raise SchemaMismatch(
                f"table {table}: columns differ: {'; '.join(said)} (select the table's columns,"
                " or ALTER TABLE first)"
            )
        lacking = [name for name in AUDIT_COLUMNS if name not in by_fold]
        for name in lacking:
            self.execute(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(name)} {AUDIT_TYPES[name]}")
        if lacking:
            log.warning(
                "pidctl-sql: added the audit column(s) %s to the existing table %s (NULL in its"
                " earlier rows)",
                ", ".join(lacking),
                table,
            )
        return [by_fold[name.lower()] for name in names]

    def committed_version(self, table: str, app_id: str) -> tuple[int, str] | None:
        """The highest committed version of ``app_id`` on ``table`` and the write that
        committed it, or None."""
        row = self.execute(
            "SELECT app_version, write_id FROM pidctl_sink_writes WHERE table_name = ? AND "
            "app_id = ? AND state = 'committed' ORDER BY app_version DESC LIMIT 1",
            (table_name(table), app_id),
        ).fetchone()
        self.connection.commit()
        return None if row is None else (int(row[0]), str(row[1]))

    def committed_versions(self, table: str) -> dict[str, int]:
        """Per app id, the highest version committed on ``table`` (``pidctl_sink_versions``)."""
        rows = self.execute(
            "SELECT app_id, version FROM pidctl_sink_versions WHERE table_name = ?",
            (table_name(table),),
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
        return self._begin(write)

    @_one_transaction
    def begin_staged_write(self, write: Write, columns: Sequence[tuple[str, str]]) -> Outcome:
        """:meth:`begin_write`, and if the write is open, create its own staging table
        (:func:`write_stage_table`) in the same transaction: ``columns`` (name as the table
        spells it, SQL type) and the audit columns, no constraint. In PostgreSQL it is
        UNLOGGED (its rows are written once more, durably, by the publish) and holds a
        sentinel row that a crash of the database would take with the others."""
        outcome = self._begin(write)
        if outcome.state is WriteState.OPEN:
            stage = quote(write_stage_table(write.write_id))
            declared = [f"{quote(name)} {kind}" for name, kind in columns]
            declared += [f"{quote(name)} {kind}" for name, kind in AUDIT_TYPES.items()]
            self.execute(f"CREATE {self.unlogged}TABLE {stage} ({', '.join(declared)})")
            self.execute(
                f"INSERT INTO {stage} (pidctl_producer_id, pidctl_sequence) VALUES (?, 0)",
                (SENTINEL_PRODUCER,),
            )
        return outcome

    @_one_transaction
    def record_skip(self, write: Write, reason: str) -> None:
        """Leave a ``skipped`` row for a write the driver decided not to run."""
        self._insert_write(
            replace(write, table=table_name(write.table)), WriteState.SKIPPED, time.time(), reason
        )

    def _begin(self, write: Write) -> Outcome:
        write = replace(write, table=table_name(write.table))
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

    def outcome(self, write_id: str) -> Outcome:
        """How the write stands: its state, rows published and reason."""
        state = self._state(write_id)
        self.connection.commit()
        return state

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
        table = table_name(table)
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
            f"DELETE FROM {quote(stage_table(table))} WHERE pidctl_write_id NOT IN (SELECT write_id"
            " FROM pidctl_sink_writes WHERE state = 'open')"
        )
        return aborted

    @_one_transaction
    def beat(self, write_id: str) -> bool:
        """A sign of life of an open write from its driver (``write_sql`` writes no batches
        the recovery could see): the row of producer id -1 in ``pidctl_sink_producers``, its
        ``updated_at`` now. False once the write has ended."""
        if self._state(write_id, self.share_lock).state is not WriteState.OPEN:
            return False
        self.execute(
            "INSERT INTO pidctl_sink_producers VALUES (?, ?, 0, -1, -1, ?) ON CONFLICT"
            " (write_id, producer_id) DO UPDATE SET updated_at = excluded.updated_at",
            (write_id, SENTINEL_PRODUCER, time.time()),
        )
        return True

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
            names = [*map(quote, columns), "pidctl_sequence"]
            values = [self.placeholder] * len(names) + [str(int(producer_id)), _literal(write_id)]
            self.connection.cursor().executemany(
                f"INSERT INTO {quote(stage_table(table))} ({', '.join(names)}, pidctl_producer_id,"
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

    def _publishable(self, write_id: str, table: str) -> Outcome | None:
        """None if the write (its row now held alone) may be published; else how it ended:
        as it was (already committed or skipped), or aborted by a conflict — another write of
        its app id committed this version or a later one while it ran (Delta Lake's
        ConcurrentTransactionException; the caller raises :class:`ConcurrentWriteError`).
        An aborted write raises WriteAborted."""
        state = self._state(write_id, self.update_lock)
        if state.state in (WriteState.COMMITTED, WriteState.SKIPPED):
            return state
        if state.state is not WriteState.OPEN:
            raise WriteAborted(f"write {write_id} was aborted ({state.reason})")
        app = self.execute(
            "SELECT app_id, app_version FROM pidctl_sink_writes WHERE write_id = ?", (write_id,)
        ).fetchone()
        if app[0] is None:
            return None
        done = self.execute(
            "SELECT write_id, app_version FROM pidctl_sink_writes WHERE table_name = ? AND"
            " app_id = ? AND state = 'committed' AND app_version >= ?"
            " ORDER BY app_version DESC LIMIT 1",
            (table, app[0], app[1]),
        ).fetchone()
        if done is None:
            return None
        reason = (
            f"write {write_id} (version {app[1]} of {app[0]}) lost a race: write {done[0]}"
            f" committed version {done[1]} of {app[0]} to {table} while it ran; nothing of"
            " this write is published"
        )
        self._end(write_id, table, WriteState.ABORTED, reason)
        return Outcome(WriteState.ABORTED, 0, reason)

    @_one_transaction
    def publish(
        self, write_id: str, table: str, columns: Sequence[str], reports: Sequence[ProducerReport]
    ) -> Outcome:
        """Publish a write in one transaction (see the module documentation). An already
        committed or skipped write is left as it is; an aborted one raises WriteAborted; one
        that lost a race returns ABORTED (see :meth:`_publishable`); staged sequences that do
        not match the tasks' reports raise RuntimeError (nothing published)."""
        table = table_name(table)
        ended = self._publishable(write_id, table)
        if ended is not None:
            return ended
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
        names = ", ".join(map(quote, [*columns, *AUDIT_COLUMNS]))
        self.execute(
            f"INSERT INTO {quote(table)} ({names}) SELECT {names} FROM"
            f" {quote(stage_table(table))} WHERE pidctl_write_id = ?",
            (write_id,),
        )
        rows = sum(last + 1 for last in staged.values())
        self._end(write_id, table, WriteState.COMMITTED, None, rows)
        now = time.time()
        job = self._job(write_id)
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

    def _job(self, write_id: str) -> str:
        return str(
            self.execute(
                "SELECT job FROM pidctl_sink_writes WHERE write_id = ?", (write_id,)
            ).fetchone()[0]
        )

    @_one_transaction
    def publish_stage(
        self,
        write_id: str,
        table: str,
        columns: Sequence[str],
        epoch: int,
        conversions: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Publish a write staged by Spark's JDBC writer into its own table
        (:meth:`begin_staged_write`), in one transaction.

        Each task attempt stages its whole partition in one transaction: rows (producer id,
        sequences 0..n-1); a retried or speculative attempt that had also committed stages a
        second copy. So per producer the staged rows are k complete copies: count = k * n,
        sequences 0..n-1. One copy of each (producer id, sequence) is published — a plain
        copy when k = 1, the common case; anything else (a gap, a partial copy) is refused and
        nothing is published. A stage without its sentinel row was emptied by a crash of
        PostgreSQL (UNLOGGED): refused too. Conflicts and ended writes: as :meth:`publish`.
        ``conversions``: per column, the SQL expression (``{c}``: the staged column) that
        turns its staged value into the table's."""
        table = table_name(table)
        ended = self._publishable(write_id, table)
        if ended is not None:
            return ended
        stage = quote(write_stage_table(write_id))
        if self.stage_lock:
            # The check and the copy below are two statements, each seeing what had committed
            # when it began (READ COMMITTED): an attempt committing between them (a zombie
            # of a finished job) would be copied without having been counted.
            self.execute(self.stage_lock.format(stage=stage))
        producers = self.execute(
            "SELECT pidctl_producer_id, COUNT(*), MIN(pidctl_sequence), MAX(pidctl_sequence)"
            f" FROM {stage} GROUP BY pidctl_producer_id"
        ).fetchall()
        counts = {int(p): (int(n), int(low), int(high)) for p, n, low, high in producers}
        if counts.pop(SENTINEL_PRODUCER, None) is None:
            raise RuntimeError(
                f"write {write_id}: its staging table lost its rows (the database restarted"
                " after a crash during the write, and emptied the UNLOGGED stage); nothing"
                " published: run the job again"
            )
        broken = {
            producer: (n, low, high)
            for producer, (n, low, high) in counts.items()
            if low != 0 or n % (high + 1) != 0
        }
        if broken:
            some = dict(sorted(broken.items())[:5])
            raise RuntimeError(
                f"write {write_id}: staged rows per producer (count, first, last sequence) are"
                f" not whole copies of a partition: {some}; was the input not deterministic?"
                " nothing published"
            )
        copied = [p for p, (n, _, high) in counts.items() if n > high + 1]
        names = ", ".join(map(quote, [*columns, *AUDIT_COLUMNS]))
        convert = conversions or {}
        values = ", ".join(
            convert[name].format(c=quote(name)) if name in convert else quote(name)
            for name in [*columns, *AUDIT_COLUMNS]
        )
        insert = f"INSERT INTO {quote(table)} ({names}) SELECT {values} FROM {stage} WHERE"
        if not copied:
            self.execute(f"{insert} pidctl_producer_id >= 0")
        else:
            # One copy per (producer, sequence): the first, by the row's position.
            listed = ", ".join(str(int(p)) for p in copied)
            self.execute(
                f"{insert} pidctl_producer_id >= 0 AND pidctl_producer_id NOT IN ({listed})"
            )
            self.execute(
                f"{insert} {self.row_position} IN (SELECT MIN({self.row_position}) FROM {stage}"
                f" WHERE pidctl_producer_id IN ({listed})"
                " GROUP BY pidctl_producer_id, pidctl_sequence)"
            )
        rows = sum(high + 1 for _, _, high in counts.values())
        job = self._job(write_id)
        now = time.time()
        self.connection.cursor().executemany(
            f"INSERT INTO pidctl_sink_commits VALUES ({', '.join([self.placeholder] * 9)})",
            [
                (write_id, job, table, producer, epoch, high, high + 1, n - high - 1, now)
                for producer, (n, _, high) in sorted(counts.items())
            ],
        )
        self._end(write_id, table, WriteState.COMMITTED, None, rows)
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
        self.execute(
            f"DELETE FROM {quote(stage_table(table))} WHERE pidctl_write_id = ?", (write_id,)
        )

    def _end(
        self, write_id: str, table: str, state: WriteState, reason: str | None, rows: int = 0
    ) -> None:
        """Mark a write ended; its staged rows and producer states go (the caller holds the
        write's row)."""
        self._delete_staged(write_id, table)
        # A write staged through Spark's JDBC writer has a table of its own.
        self.execute(f"DROP TABLE IF EXISTS {quote(write_stage_table(write_id))}")
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
            self.execute(f"DELETE FROM {quote(stage_table(table))}")
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

    def table_columns(self, table: str) -> list[str] | None:
        rows = self.execute(f"PRAGMA table_info({quote(table)})").fetchall()
        return [str(row[1]) for row in rows] or None


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
    unlogged = "UNLOGGED "
    row_position = "ctid"
    # SHARE conflicts with the ROW EXCLUSIVE an INSERT takes: the publish waits for attempts
    # still staging, and later ones wait for it (then find the stage gone).
    stage_lock = "LOCK TABLE {stage} IN SHARE MODE"

    def __init__(self, url: str) -> None:
        import psycopg

        super().__init__(psycopg.connect(url))

    def stage_without_syncing(self) -> None:
        # Asynchronous commit: a crash may lose the last transactions, never part of one;
        # the publish's synchronous commit flushes the WAL up to it, staged batches included.
        self.execute("SET synchronous_commit TO OFF")
        self.connection.commit()

    def table_columns(self, table: str) -> list[str] | None:
        rows = self.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema ="
            " current_schema() AND table_name = ? ORDER BY ordinal_position",
            (table,),
        ).fetchall()
        return [str(row[0]) for row in rows] or None

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
