"""``df.write.format("pidctl-sql")``: an exactly-once, atomic SQL sink as a Spark 4 Python
data source (``df.writeStream.format("pidctl-sql")``: see :mod:`pidctl.spark.stream`).

    (df.write.format("pidctl-sql")
       .option("bootstrap", "127.0.0.1:9093")        # pidctl
       .option("url", "sqlite:///data/orders.db")     # or postgresql://user@host/db
       .option("table", "orders")
       .option("txnAppId", "nightly-orders")          # optional: idempotent re-runs
       .option("txnVersion", "20261123")
       .mode("append").save())

``writer()`` runs once on the driver before any task: it creates the tables, removes what
crashed writes to the table left behind, preallocates one producer id per partition from
pidctl (one connection, pipelined) and registers the write. Each task stages its partition
in batches of ``batchSize`` rows; batch k of partition p is (producer id of p, the job's
epoch, sequences from k * batchSize), applied in one database transaction with the
producer's sequence state, so a retried or speculative attempt's batches are skipped as
duplicates — provided the partition's rows arrive in the same order on every attempt (true of
a deterministic input; sort within partitions after a shuffle). ``commit()`` publishes the
staged rows into the table in one transaction; ``abort()`` removes them. Readers of the
table see all of a write's rows or none (:mod:`pidctl.spark.sqlstore`).

Options: bootstrap, url, table (required); partitions (producer ids to preallocate: at
least the DataFrame's partitions; default 1000, one block); batchSize (rows per database
transaction, default 1000); txnAppId and txnVersion (Delta Lake's: a write whose app id has
committed this version or a later one on the table writes nothing and says so; an earlier
failed or crashed write of the same version is replaced); abandonedAfterSeconds (an open
write on the table with no batch for this long is taken for crashed and removed by the next
write, default 3600); clientId (the grant records in pidctl's log carry it; default: the
Spark application id when registered with ``register_data_sources``, else
``pidctl-sql-sink``); for a secured pidctl, Kafka's client properties ``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password`` and ``ssl.cafile``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pidctl.spark.allocation import JobAllocation, allocate_job_blocks, client_settings
from pidctl.spark.sequencing import Decision
from pidctl.spark.sqlstore import (
    ConcurrentWriteError,
    ProducerReport,
    SchemaMismatch,
    SqlStore,
    Write,
    WriteAborted,
    WriteState,
    check_column,
    dialect_of,
    log,
    open_store,
    table_name,
)
from pidctl.spark.types import Column, arrow_rows, plan_columns

DEFAULT_BATCH_SIZE = 1000
DEFAULT_PARTITIONS = 1000
#: An open write with no batch for this long is taken for crashed (``abandonedAfterSeconds``).
DEFAULT_ABANDONED_AFTER_S = 3600


class SinkOptionError(ValueError):
    """A missing or invalid option of the sink."""


@dataclass
class SinkCommit(WriterCommitMessage):
    """A task's report to the driver; None from a task of a skipped write."""

    report: ProducerReport | None


def batches(
    rows: Iterable[Any], size: int, convert: Callable[[Any], tuple[Any, ...]] = tuple
) -> Iterator[list[tuple[Any, ...]]]:
    """Rows as converted tuples, ``size`` at a time, read lazily (a task's rows are a stream)."""
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        batch.append(convert(row))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _option(options: dict[str, str], name: str) -> str:
    value = options.get(name.lower())
    if not value:
        raise SinkOptionError(f'pidctl-sql needs .option("{name}", ...)')
    return value


def _positive(options: dict[str, str], name: str, default: int, zero: bool = False) -> int:
    raw = options.get(name.lower()) or str(default)
    if not raw.isdigit() or (int(raw) == 0 and not zero):
        kind = "a non-negative" if zero else "a positive"
        raise SinkOptionError(f"option {name} must be {kind} integer, got {raw!r}")
    return int(raw)


def _blocks(raw: str | None) -> tuple[tuple[int, int], ...] | None:
    if raw is None:
        return None
    try:
        blocks = tuple(
            (int(first), int(length))
            for first, length in (block.split(":") for block in raw.split(","))
        )
    except ValueError:
        blocks = ()
    if not blocks or any(first < 0 or length <= 0 for first, length in blocks):
        raise SinkOptionError(f"option preallocated must be FIRST:LENGTH,..., got {raw!r}")
    return blocks


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, checked (Spark hands them over with lower-cased names)."""

    url: str
    table: str
    bootstrap: str
    batch_size: int
    partitions: int
    job: str
    abandoned_after_s: int
    app_id: str | None
    app_version: int | None
    connection: dict[str, Any]
    #: Producer id blocks the driver already holds (``write_sql``: option ``preallocated``,
    #: ``FIRST:LENGTH,...``), or None to ask pidctl.
    preallocated: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def parse(cls, options: dict[str, str], default_client_id: str | None) -> SinkOptions:
        """Check every option; a missing or invalid one raises :class:`SinkOptionError`."""
        options = {name.lower(): value for name, value in options.items()}
        app_id = options.get("txnappid") or None
        raw_version = options.get("txnversion")
        if (app_id is None) != (raw_version is None):
            raise SinkOptionError("txnAppId and txnVersion go together: set both or neither")
        version = None
        if raw_version is not None:
            version = _positive(options, "txnVersion", 0, zero=True)
        try:
            connection = client_settings(options)
            table = table_name(_option(options, "table"))
        except SinkOptionError:
            raise
        except ValueError as e:
            raise SinkOptionError(str(e)) from None
        return cls(
            url=_option(options, "url"),
            table=table,
            bootstrap=_option(options, "bootstrap"),
            batch_size=_positive(options, "batchSize", DEFAULT_BATCH_SIZE),
            partitions=_positive(options, "partitions", DEFAULT_PARTITIONS),
            job=options.get("clientid") or default_client_id or "pidctl-sql-sink",
            abandoned_after_s=_positive(
                options, "abandonedAfterSeconds", DEFAULT_ABANDONED_AFTER_S, zero=True
            ),
            app_id=app_id,
            app_version=version,
            connection=connection,
            preallocated=_blocks(options.get("preallocated")),
        )

    def allocate(self) -> JobAllocation:
        """The write's producer ids, one per partition, from pidctl."""
        if self.preallocated is not None:
            return JobAllocation(self.job, self.preallocated)
        return allocate_job_blocks(self.bootstrap, self.partitions, self.job, **self.connection)


def plan_table(store: SqlStore, options: SinkOptions, schema: StructType) -> list[Column]:
    """Plan the columns (the type map), check them against an existing table (or create it),
    and remove what abandoned writes to the table left behind; on the driver, before any
    task. Every problem raises :class:`SinkOptionError` or :class:`SchemaMismatch` naming the
    column. The columns come back named as the table spells them."""
    try:
        columns = plan_columns(schema.fields, dialect_of(options.url))
        for column in columns:
            check_column(column.name)
    except ValueError as e:
        raise SinkOptionError(str(e)) from None
    spelled = store.create_tables(options.table, [(c.name, c.sql_type) for c in columns])
    for write_id in store.recover(options.table, options.abandoned_after_s):
        log.warning("pidctl-sql: removed the abandoned write %s to %s", write_id, options.table)
    return [replace(c, name=name) for c, name in zip(columns, spelled, strict=True)]


def prepare_table(options: SinkOptions, schema: StructType) -> list[Column]:
    """:func:`plan_table` on a connection of its own."""
    store = open_store(options.url)
    try:
        return plan_table(store, options, schema)
    finally:
        store.close()


def skip_if_committed(store: SqlStore, options: SinkOptions) -> str | None:
    """With ``txnAppId``: if that app committed this version or a later one on the table,
    leave a ``skipped`` row in ``pidctl_sink_writes``, warn, and return why; else None."""
    if options.app_id is None or options.app_version is None:
        return None
    done = store.committed_version(options.table, options.app_id)
    if done is None or done[0] < options.app_version:
        return None
    reason = (
        f"version {done[0]} of {options.app_id} was committed by write {done[1]}: "
        f"version {options.app_version} writes nothing"
    )
    # Named like no write of a job (those are producer ids): the skip allocated none.
    write_id = f"skipped-{uuid.uuid4().hex}"
    store.record_skip(
        Write(write_id, options.table, options.job, options.app_id, options.app_version), reason
    )
    log.warning("pidctl-sql: %s", reason)
    return reason


def arrow_batches_as_rows(record_batches: Iterable[Any], columns: list[Column]) -> Iterator[Any]:
    """The rows of Spark's Arrow record batches, converted by the type map."""
    for record_batch in record_batches:
        yield from arrow_rows(record_batch, columns)


def stage_partition(
    store: SqlStore,
    write_id: str,
    options: SinkOptions,
    columns: list[Column],
    partition: int,
    producer: tuple[int, int],
    rows: Iterable[Any],
) -> ProducerReport:
    """Stage one partition's rows (tuples, converted), batch by batch; the same rows give
    the same batches."""
    producer_id, epoch = producer
    names = [c.name for c in columns]
    store.stage_without_syncing()
    written = duplicates = sequence = 0
    for batch in batches(rows, options.batch_size):
        decision = store.apply_batch(
            write_id, options.table, names, producer_id, epoch, sequence, batch
        )
        if decision is Decision.APPEND:
            written += len(batch)
        else:
            duplicates += len(batch)
        sequence += len(batch)
    return ProducerReport(
        write_id, partition, producer_id, epoch, sequence - 1, written, duplicates
    )


def publish(options: SinkOptions, columns: list[Column], write_id: str, reports: list[Any]) -> None:
    """The commit: publish the write's staged rows, or say why nothing was published."""
    producer_reports = [m.report for m in reports if isinstance(m, SinkCommit) and m.report]
    store = open_store(options.url)
    try:
        outcome = store.publish(
            write_id, options.table, [c.name for c in columns], producer_reports
        )
    finally:
        store.close()
    if outcome.state is WriteState.ABORTED:
        raise ConcurrentWriteError(outcome.reason)
    if outcome.state is WriteState.SKIPPED:
        log.warning("pidctl-sql: write %s published nothing: %s", write_id, outcome.reason)


def abort(options: SinkOptions, write_id: str, reason: str) -> None:
    """Remove a failed write's staged rows; its later batches are refused."""
    store = open_store(options.url)
    try:
        store.abort(write_id, options.table, reason)
    finally:
        store.close()


class PidctlSqlSink(DataSource):
    """The data source; see the module documentation."""

    #: Set by :func:`pidctl.spark.register_data_sources` on the class it registers: the default
    #: client id. The writer is built in a Python worker that does not know the application.
    application_id: str | None = None

    @classmethod
    def name(cls) -> str:
        return "pidctl-sql"

    def writer(self, schema: StructType, overwrite: bool) -> ExactlyOnceWriter:
        if overwrite:
            raise SinkOptionError('pidctl-sql only appends: use .mode("append")')
        return ExactlyOnceWriter(dict(self.options), schema, self.application_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pidctl.spark.stream import ExactlyOnceStreamWriter

        if overwrite:
            raise SinkOptionError('pidctl-sql only appends: use .outputMode("append")')
        return ExactlyOnceStreamWriter(dict(self.options), schema, self.application_id)


class ExactlyOnceWriter(DataSourceArrowWriter):
    """Built on the driver (tables, recovery, preallocation), pickled to every task; reads
    Spark's Arrow batches (no Row objects)."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None = None
    ) -> None:
        self.options = SinkOptions.parse(options, default_client_id)
        #: Why this write writes nothing (its version was committed), or None.
        self.skipped: str | None = None
        self.write_id = ""
        self.allocation = JobAllocation(self.options.job, ())
        store = open_store(self.options.url)
        try:
            self.columns = plan_table(store, self.options, schema)
            self.skipped = skip_if_committed(store, self.options)
        finally:
            store.close()
        if self.skipped is not None:
            return
        self.allocation = self.options.allocate()
        # The write is named by its first producer id: unique, as pidctl never grants twice.
        self.write_id = str(self.allocation.blocks[0][0])
        write = Write(
            self.write_id,
            self.options.table,
            self.options.job,
            self.options.app_id,
            self.options.app_version,
        )
        store = open_store(self.options.url)
        try:
            outcome = store.begin_write(write)
        finally:
            store.close()
        if outcome.state is WriteState.SKIPPED:
            self.skipped = outcome.reason
            log.warning("pidctl-sql: %s", outcome.reason)

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        if self.skipped is not None:
            for _ in iterator:  # Spark streams the partition in: read it to the end
                pass
            return SinkCommit(None)
        return self.write_partition(context.partitionId(), self.rows(iterator))

    def rows(self, record_batches: Iterator[Any]) -> Iterator[Any]:
        """A task's rows from Spark's Arrow batches, converted by the type map."""
        return arrow_batches_as_rows(record_batches, self.columns)

    def write_partition(self, partition: int, rows: Iterable[Any]) -> SinkCommit:
        """Stage one partition's rows, tuples converted by the type map (nothing when the
        write is skipped)."""
        if self.skipped is not None:
            for _ in rows:  # Spark streams the partition in: read it to the end
                pass
            return SinkCommit(None)
        store = open_store(self.options.url)
        try:
            report = stage_partition(
                store,
                self.write_id,
                self.options,
                self.columns,
                partition,
                self.allocation.producer(partition),
                rows,
            )
        finally:
            store.close()
        return SinkCommit(report)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.skipped is None:
            publish(self.options, self.columns, self.write_id, list(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.skipped is None:
            abort(self.options, self.write_id, "the Spark job failed")


__all__ = [
    "ConcurrentWriteError",
    "ExactlyOnceWriter",
    "PidctlSqlSink",
    "SchemaMismatch",
    "SinkCommit",
    "SinkOptionError",
    "SinkOptions",
    "WriteAborted",
    "batches",
]
