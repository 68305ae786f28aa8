"""``write_sql(df, ...)``: the exactly-once SQL sink for batch jobs, from the driver, with the
rows moved by Spark's own JVM JDBC writer.

    from pidctl.spark import write_sql

    write_sql(orders, bootstrap="127.0.0.1:9093", url="postgresql://user@db/shop",
              table="orders", txnAppId="nightly-orders", txnVersion=20261123)

The same options, tables and guarantees as ``format("pidctl-sql")`` (:mod:`pidctl.spark.sink`,
docs/spark-sink.md), decided where the data source cannot decide them: on the driver, before
any task. ``write_sql``

1. plans the columns and checks them against an existing table (naming every missing or extra
   column), and if the ``txnAppId`` committed this version or a later one, leaves a
   ``skipped`` row and returns at once — no Spark job runs;
2. preallocates one producer id per partition of the DataFrame (``partitions`` defaults to
   the DataFrame's own count; a smaller value is refused) and registers the write, creating
   its own staging table ``pidctl_stage_w<hash>`` (PostgreSQL: UNLOGGED, with a sentinel row);
3. adds each row's producer id (from ``spark_partition_id()``, through the allocation's
   blocks) and sequence (its position in the partition, the low 33 bits of
   ``monotonically_increasing_id()``) as JVM expressions, and appends the rows to the stage
   with ``DataFrameWriter.jdbc``: each task writes its partition in one database transaction;
4. publishes in one transaction (:meth:`pidctl.spark.sqlstore.SqlStore.publish_stage`): one
   copy of each (producer id, sequence) — an attempt retried after its transaction had
   committed, or a speculative one, staged a second copy — into the table, and drops the
   stage. A failed job aborts the write; a killed driver leaves an ``open`` write that its
   re-run or the recovery removes, as for the data source.

Why not the Python data source: on a two-worker standalone cluster, Spark's Python writer
path costs about 40 ms per task before any row is written, twice Spark's whole JDBC task, and
turning Arrow batches into Python rows costs more than the database (docs/spark-sink.md has
the figures). The JDBC path needs PostgreSQL's JDBC driver on Spark's class path, as
``df.write.jdbc`` does (``--jars /usr/share/java/postgresql.jar``). A SQLite ``url`` (a file on
the driver's machine) is written by ``format("pidctl-sql")`` after the same driver-side
checks.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pidctl.spark.allocation import JobAllocation, application_id
from pidctl.spark.sink import (
    SinkOptionError,
    SinkOptions,
    abort,
    plan_table,
    skip_if_committed,
)
from pidctl.spark.sqlstore import (
    ConcurrentWriteError,
    Write,
    WriteState,
    dialect_of,
    open_store,
    write_stage_table,
)
from pidctl.spark.types import JDBC_STAGED_AS, Column

log = logging.getLogger("pidctl.spark")

#: Rows per partition the sequence expression can number: ``monotonically_increasing_id()``
#: keeps a row's position in its partition in its low 33 bits.
_POSITION_BITS = 33


@dataclass(frozen=True, slots=True)
class WriteResult:
    """How :func:`write_sql` ended: ``committed`` (``rows`` published by ``write_id``) or
    ``skipped`` (``reason`` says which write had committed the version)."""

    state: str
    rows: int | None
    write_id: str = ""
    reason: str = ""


def jdbc_location(url: str) -> tuple[str, dict[str, str]]:
    """``postgresql://user:pw@host:port/db?params`` as a JDBC URL and its user and password
    properties."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise SinkOptionError(f"url {url!r}: expected postgresql://[user[:password]@]host/db")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port else ""
    query = f"?{parts.query}" if parts.query else ""
    properties = {}
    if parts.username:
        properties["user"] = urllib.parse.unquote(parts.username)
    if parts.password:
        properties["password"] = urllib.parse.unquote(parts.password)
    return f"jdbc:postgresql://{host}{port}{parts.path or '/'}{query}", properties


def producer_columns(allocation: JobAllocation) -> tuple[Any, Any]:
    """JVM expressions of a row's producer id and sequence: partition p's producer id is the
    allocation's p-th (a partition beyond it fails its task naming the allocation), the
    sequence is the row's position in its partition — the same on every attempt of a
    deterministic input, as for the Python writers."""
    from pyspark.sql import functions as F

    partition = F.spark_partition_id()
    producer: Any = None
    offset = 0
    for first, length in allocation.blocks:
        inside = partition < F.lit(offset + length)
        value = F.lit(first - offset).cast("long") + partition
        producer = F.when(inside, value) if producer is None else producer.when(inside, value)
        offset += length
    beyond = F.raise_error(
        F.concat(
            F.lit("pidctl-sql: partition "),
            partition.cast("string"),
            F.lit(f" is beyond the {offset} producer ids preallocated for {allocation.client_id}"),
        )
    )
    producer = producer.otherwise(beyond).cast("long")
    position = F.monotonically_increasing_id().bitwiseAND(F.lit((1 << _POSITION_BITS) - 1))
    return producer, position.cast("int")


def staged_frame(df: Any, columns: list[Column], allocation: JobAllocation) -> Any:
    """``df``'s columns named as the table spells them (dates and timestamps as numbers:
    :data:`~pidctl.spark.types.JDBC_STAGED_AS`), plus the audit columns."""
    from pyspark.sql import functions as F

    producer, sequence = producer_columns(allocation)
    data = []
    for field, column in zip(df.schema.fieldNames(), columns, strict=True):
        reference = "`" + field.replace("`", "``") + "`"
        if column.kind in JDBC_STAGED_AS:
            value = F.expr(JDBC_STAGED_AS[column.kind][1].format(c=reference))
        else:
            value = F.col(reference)
        data.append(value.alias(column.name))
    return df.select(*data, producer.alias("pidctl_producer_id"), sequence.alias("pidctl_sequence"))


class Heartbeat:
    """While the Spark job runs, the driver marks its write alive every quarter of
    ``abandonedAfterSeconds`` (at most every minute), so that no other write to the table
    takes a long job for an abandoned one (:meth:`~pidctl.spark.sqlstore.SqlStore.beat`)."""

    def __init__(self, url: str, write_id: str, abandoned_after_s: int) -> None:
        self.url, self.write_id = url, write_id
        self.interval = max(1.0, min(60.0, abandoned_after_s / 4))
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pidctl-sql-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                store = open_store(self.url)
                try:
                    if not store.beat(self.write_id):
                        return
                finally:
                    store.close()
            except Exception as e:  # the database away for a while: the job will tell
                log.warning("pidctl-sql: write %s: heartbeat failed: %s", self.write_id, e)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


def _settings(df: Any, options: Mapping[str, Any]) -> SinkOptions:
    partitions = int(df.rdd.getNumPartitions())
    lowered = {str(name).lower(): str(value) for name, value in options.items()}
    lowered.setdefault("partitions", str(max(partitions, 1)))
    parsed = SinkOptions.parse(lowered, application_id(df.sparkSession))
    if parsed.partitions < partitions:
        raise SinkOptionError(
            f"option partitions is {parsed.partitions}, but the DataFrame has {partitions}"
            " partitions, each needing a producer id (leave the option out: the allocation is"
            " then sized from the DataFrame)"
        )
    return parsed


def write_sql(df: Any, options: Mapping[str, Any] | None = None, /, **named: Any) -> WriteResult:
    """Write ``df`` exactly once, atomically, into ``table`` at ``url`` (see the module).
    ``options`` and ``named`` are the sink's options (docs/spark-sink.md); dotted names such
    as ``security.protocol`` go in ``options``. Raises :class:`SinkOptionError` or
    :class:`~pidctl.spark.sqlstore.SchemaMismatch` before any task, and
    :class:`ConcurrentWriteError` if another write of the ``txnAppId`` committed this
    version or a later one while this one ran."""
    settings = _settings(df, {**(options or {}), **named})
    store = open_store(settings.url)
    try:
        columns = plan_table(store, settings, df.schema)
        skipped = skip_if_committed(store, settings)
    finally:
        store.close()
    if skipped is not None:
        return WriteResult(WriteState.SKIPPED.value, 0, reason=skipped)
    if dialect_of(settings.url) == "sqlite":
        return _write_with_data_source(df, {**(options or {}), **named}, settings)
    return _write_through_jdbc(df, settings, columns)


def _write_with_data_source(
    df: Any, options: Mapping[str, Any], settings: SinkOptions
) -> WriteResult:
    """SQLite: ``format("pidctl-sql")`` with the producer ids fetched here, so that the
    write's id (its first producer id) is known to the driver."""
    from pidctl.spark import register_data_sources

    register_data_sources(df.sparkSession)
    allocation = settings.allocate()
    writer = df.write.format("pidctl-sql").mode("append")
    for name, value in options.items():
        writer = writer.option(name, str(value))
    blocks = ",".join(f"{first}:{length}" for first, length in allocation.blocks)
    writer.option("partitions", str(settings.partitions)).option("preallocated", blocks).save()
    write_id = str(allocation.blocks[0][0])
    store = open_store(settings.url)
    try:
        ended = store.outcome(write_id)
    finally:
        store.close()
    return WriteResult(ended.state.value, ended.rows, write_id, ended.reason)


def _write_through_jdbc(df: Any, settings: SinkOptions, columns: list[Column]) -> WriteResult:
    jdbc_url, properties = jdbc_location(settings.url)
    allocation = settings.allocate()
    write_id = str(allocation.blocks[0][0])
    write = Write(write_id, settings.table, settings.job, settings.app_id, settings.app_version)
    store = open_store(settings.url)
    try:
        staged_types = [
            (c.name, JDBC_STAGED_AS[c.kind][0] if c.kind in JDBC_STAGED_AS else c.sql_type)
            for c in columns
        ]
        outcome = store.begin_staged_write(write, staged_types)
    finally:
        store.close()
    if outcome.state is WriteState.SKIPPED:
        log.warning("pidctl-sql: %s", outcome.reason)
        return WriteResult(outcome.state.value, 0, write_id, outcome.reason)
    properties.update(
        driver="org.postgresql.Driver",
        batchsize=str(settings.batch_size),
        # Each task's partition in one transaction: what makes a failed attempt leave nothing.
        isolationLevel="READ_COMMITTED",
        # The JDBC driver sends a batch as multi-row INSERTs instead of one statement per row:
        # PostgreSQL's CPU for the stage fell from about 7 s to 2.3 s per million rows, the
        # stage and the publish together (docs/spark-sink.md). Each task's rows still go in
        # one transaction, in the same order.
        reWriteBatchedInserts="true",
    )
    heartbeat = Heartbeat(settings.url, write_id, settings.abandoned_after_s)
    try:
        with heartbeat:
            stage = staged_frame(df, columns, allocation)
            stage.write.jdbc(jdbc_url, write_stage_table(write_id), "append", properties)
    except BaseException as e:
        reason = f"the Spark job failed: {str(e).strip().splitlines()[0] if str(e) else e!r}"
        try:
            abort(settings, write_id, reason[:500])
        except Exception as cleanup:  # the job's error is the one to see
            log.warning("pidctl-sql: could not abort write %s: %s", write_id, cleanup)
        raise
    store = open_store(settings.url)
    try:
        published = store.publish_stage(
            write_id,
            settings.table,
            [c.name for c in columns],
            allocation.epoch,
            {c.name: JDBC_STAGED_AS[c.kind][2] for c in columns if c.kind in JDBC_STAGED_AS},
        )
    finally:
        store.close()
    if published.state is WriteState.ABORTED:
        raise ConcurrentWriteError(published.reason)
    return WriteResult(published.state.value, published.rows, write_id, published.reason)


__all__ = ["ConcurrentWriteError", "WriteResult", "jdbc_location", "write_sql"]
