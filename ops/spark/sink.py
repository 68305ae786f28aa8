"""``df.write.format("pidctl-sql")``: an exactly-once SQL sink as a Spark 4 Python data source.

    (df.write.format("pidctl-sql")
       .option("bootstrap", "127.0.0.1:9093")        # pidctl
       .option("url", "/data/orders.db")              # or postgresql://user@host/db
       .option("table", "orders")
       .option("partitions", str(df.rdd.getNumPartitions()))
       .mode("append").save())

``writer()`` runs once on the driver before any task: it preallocates one producer id per
partition from pidctl (one connection, pipelined) and creates the tables. Each task writes its
partition in batches of ``batchSize`` rows; batch k of partition p is (producer id of p, the
job's epoch, sequences from k * batchSize), applied in one database transaction with the
producer's sequence state. A retried or speculative attempt replays the same batches, which
are skipped as duplicates, so every input row lands exactly once — provided the partition's
rows arrive in the same order on every attempt (true of a deterministic input; sort within
partitions after a shuffle). ``commit()`` records each producer's final sequence in
``pidctl_sink_commits``; ``abort()`` deletes every row the job wrote and fences its producers.

Options: bootstrap, url, table (required); partitions (default 1000: one block), batchSize
(default 1000), clientId (the grant records in pidctl's log carry it; default: the Spark
application id when registered with ``register_data_sources``, else ``pidctl-sql-sink``);
for a secured pidctl, Kafka's client properties ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password`` and ``ssl.cafile``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pidctl.spark.allocation import JobAllocation, allocate_job_blocks, client_settings
from pidctl.spark.sequencing import Decision
from pidctl.spark.sqlstore import ProducerReport, check_identifier, open_store

DEFAULT_BATCH_SIZE = 1000
DEFAULT_PARTITIONS = 1000


class SinkOptionError(ValueError):
    """A missing or invalid option of the sink."""


@dataclass
class SinkCommit(WriterCommitMessage):
    """A task's report to the driver."""

    report: ProducerReport


def sql_columns(schema: StructType, types: dict[str, str]) -> list[tuple[str, str]]:
    """(name, SQL type) for every field; a type the sink does not map is refused by name."""
    columns = []
    for field in schema.fields:
        kind = field.dataType.typeName()
        if kind not in types:
            raise SinkOptionError(f"column {field.name!r}: type {kind} is not supported")
        columns.append((check_identifier(field.name), types[kind]))
    return columns


def batches(rows: Iterable[Any], size: int) -> Iterator[list[tuple[Any, ...]]]:
    """Rows as tuples, ``size`` at a time, read lazily (a task's rows are a stream)."""
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        batch.append(tuple(row))
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


def _positive(options: dict[str, str], name: str, default: int) -> int:
    raw = options.get(name.lower()) or str(default)
    if not raw.isdigit() or int(raw) <= 0:
        raise SinkOptionError(f"option {name} must be a positive integer, got {raw!r}")
    return int(raw)


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


class ExactlyOnceWriter(DataSourceWriter):
    """Built on the driver (preallocation, tables), pickled to every task."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None = None
    ) -> None:
        # Spark hands options over with lower-cased names; callers may not.
        options = {name.lower(): value for name, value in options.items()}
        self.url = _option(options, "url")
        self.table = check_identifier(_option(options, "table"))
        self.batch_size = _positive(options, "batchSize", DEFAULT_BATCH_SIZE)
        partitions = _positive(options, "partitions", DEFAULT_PARTITIONS)
        self.job = options.get("clientid") or default_client_id or "pidctl-sql-sink"
        try:
            connection = client_settings(options)
        except ValueError as e:
            raise SinkOptionError(str(e)) from None
        self.allocation: JobAllocation = allocate_job_blocks(
            _option(options, "bootstrap"), partitions, self.job, **connection
        )
        self.columns = [field.name for field in schema.fields]
        store = open_store(self.url)
        try:
            store.create_tables(self.table, sql_columns(schema, store.types))
        finally:
            store.close()

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        return self.write_partition(context.partitionId(), iterator)

    def write_partition(self, partition: int, rows: Iterable[Any]) -> SinkCommit:
        """Write one partition's rows, batch by batch; the same rows give the same batches."""
        producer_id, epoch = self.allocation.producer(partition)
        store = open_store(self.url)
        written = duplicates = sequence = 0
        try:
            for batch in batches(rows, self.batch_size):
                decision = store.apply_batch(
                    self.table, self.columns, producer_id, epoch, sequence, batch
                )
                if decision is Decision.APPEND:
                    written += len(batch)
                else:
                    duplicates += len(batch)
                sequence += len(batch)
        finally:
            store.close()
        report = ProducerReport(partition, producer_id, epoch, sequence - 1, written, duplicates)
        return SinkCommit(report)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        reports = [m.report for m in messages if isinstance(m, SinkCommit)]
        store = open_store(self.url)
        try:
            store.record_commit(self.job, self.table, reports)
        finally:
            store.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        store = open_store(self.url)
        try:
            store.abort_job(self.table, self.job, self.allocation.blocks)
        finally:
            store.close()
