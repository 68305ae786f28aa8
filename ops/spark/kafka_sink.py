"""``df.write.format("pidctl-kafka")``: Spark to Kafka, every row once, with the driver's
preallocated producer ids (``df.writeStream.format("pidctl-kafka")`` too). Design and limits:
docs/spark-kafka.md.

    (df.selectExpr("CAST(id AS STRING) AS key", "payload AS value")
       .write.format("pidctl-kafka")                     # instead of "kafka"
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "orders")
       .option("pidctl.bootstrap", "127.0.0.1:9093")     # the controller
       .option("txnAppId", "nightly-orders").option("txnVersion", "20261123")
       .mode("append").save())

The input is Spark's Kafka sink's: ``value`` (string or binary, required), ``key`` (string or
binary), ``headers`` (array of struct<key string, value binary>), ``topic`` (string; the
``topic`` option wins), ``partition`` (int). Options: ``kafka_options.py`` and the docs.

A batch write names its job version (``txnAppId``/``txnVersion``; without a name only with
``delivery`` ``at-least-once``): the driver decides before any task (``kafka_driver.py``),
the tasks write (``kafka_producer.py``), and the driver's ``commit()`` records the version
as completed at pidctl and logs what was written and what was there already. A run of a
completed version writes nothing. A stream's micro-batch is a version named by the query id
and the batch id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from pidctl.spark.allocation import JobAllocation
from pidctl.spark.kafka_options import KafkaSinkOptionError, KafkaSinkOptions

if TYPE_CHECKING:
    from pidctl.spark.kafka_driver import WritePlan, WriteSummary
    from pidctl.spark.kafka_producer import PartitionReport

__all__ = [
    "KafkaCommit",
    "KafkaSinkOptionError",
    "KafkaStreamWriter",
    "KafkaWriter",
    "PidctlKafkaSink",
    "check_columns",
]

log = logging.getLogger("pidctl.spark")

#: Spark's task-local properties naming a streaming query and its micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


# -- columns ----------------------------------------------------------------------------------

_BYTES = (StringType, BinaryType)


def check_columns(schema: StructType, topic_option: str | None) -> None:
    """Spark's Kafka sink's input shape: a clear error naming the column otherwise."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in fields:
        raise KafkaSinkOptionError(
            "pidctl-kafka needs a 'value' column (string or binary); the columns are "
            + ", ".join(schema.fieldNames())
        )
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], _BYTES):
            raise KafkaSinkOptionError(
                f"column '{name}' must be string or binary, not {fields[name].simpleString()}"
            )
    if topic_option is None:
        if "topic" not in fields:
            raise KafkaSinkOptionError(
                "pidctl-kafka needs a 'topic' column or .option(\"topic\", ...)"
            )
        if not isinstance(fields["topic"], StringType):
            raise KafkaSinkOptionError(
                f"column 'topic' must be string, not {fields['topic'].simpleString()}"
            )
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise KafkaSinkOptionError(
            f"column 'partition' must be int, not {fields['partition'].simpleString()}"
        )
    headers = fields.get("headers")
    if headers is not None:
        element = headers.elementType if isinstance(headers, ArrayType) else None
        names = [f.name for f in element.fields] if isinstance(element, StructType) else []
        if names != ["key", "value"]:
            raise KafkaSinkOptionError(
                "column 'headers' must be array<struct<key: string, value: binary>>, not "
                + headers.simpleString()
            )


# -- the tasks --------------------------------------------------------------------------------


@dataclass
class KafkaCommit(WriterCommitMessage):
    """A task's report: what it wrote to each Kafka partition, and what it found there
    already. ``rows_read`` alone (and no partitions) when the version had completed before."""

    spark_partition: int
    attempt: int
    producer_id: int
    partitions: list[PartitionReport] = field(default_factory=list)
    rows_read: int = 0
    #: A stream's micro-batch: its query id (``commit()`` is told only the batch id).
    query_id: str | None = None


def _count(batches: Iterator[Any]) -> int:
    return sum(batch.num_rows for batch in batches)


def write_partition(
    options: KafkaSinkOptions,
    allocation: JobAllocation,
    plan: WritePlan,
    batches: Iterator[Any],
    *,
    resume: bool | None = None,
    query_id: str | None = None,
    name: tuple[str, int] | None = None,
) -> KafkaCommit:
    """One task: its Spark partition's rows with its PID (``kafka_producer``)."""
    from pidctl.spark.kafka_producer import TaskProducer

    context = TaskContext.get()
    assert context is not None, "write() runs in a Spark task"
    partition, attempt = context.partitionId(), context.attemptNumber()
    producer_id, epoch = allocation.producer(partition)
    cluster = options.cluster()
    try:
        producer = TaskProducer(
            cluster,
            producer_id,
            epoch,
            partition,
            options.producer,
            resume=plan.resume(partition, attempt) if resume is None else resume,
            started_ms=plan.started_ms or None,
            partitions=plan.partitions,
            expiration_ms=plan.expiration_ms,
            name=name,
        )
        reports = producer.write(batches, options.topic)
    finally:
        cluster.close()
    return KafkaCommit(partition, attempt, producer_id, reports, query_id=query_id)


def _reports(messages: list[WriterCommitMessage | None]) -> list[PartitionReport]:
    return [r for m in messages if isinstance(m, KafkaCommit) for r in m.partitions]


def _rows_read(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.rows_read for m in messages if isinstance(m, KafkaCommit))


# -- the data source --------------------------------------------------------------------------


class PidctlKafkaSink(DataSource):
    """The data source; see the module documentation."""

    #: Set by :func:`pidctl.spark.register_data_sources`: the default client id.
    application_id: str | None = None

    @classmethod
    def name(cls) -> str:
        return "pidctl-kafka"

    def writer(self, schema: StructType, overwrite: bool) -> KafkaWriter:
        return KafkaWriter(dict(self.options), schema, self.application_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        return KafkaStreamWriter(dict(self.options), schema, self.application_id)


class KafkaWriter(DataSourceArrowWriter):
    """Built on the driver (options, columns, the version's producer ids, the checks of
    ``kafka_driver.plan_write``), pickled to every task; ``commit()`` back on the driver."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None
    ) -> None:
        from pidctl.spark import kafka_driver as driver

        self.options = o = KafkaSinkOptions.parse(options, default_client_id)
        check_columns(schema, o.topic)
        budget = o.producer.delivery_timeout_s
        expiration = driver.broker_expiration(o)
        self.skipped = False
        if o.app_id is not None and o.app_version is not None:
            named = driver.allocate_named(
                o.pidctl_bootstrap,
                o.partitions,
                o.app_id,
                o.app_version,
                max_age_ms=expiration,
                budget_s=budget,
                connection=o.pidctl_connection,
            )
            self.allocation, self.skipped = named.allocation, named.committed
        else:
            self.allocation = driver.allocate_unnamed(
                o.pidctl_bootstrap,
                o.partitions,
                o.client_id,
                budget_s=budget,
                connection=o.pidctl_connection,
            )
        if self.skipped:
            self.plan = driver.WritePlan(expiration_ms=expiration)
            log.warning(
                "pidctl-kafka: txnAppId %r version %s completed before: this run writes nothing",
                o.app_id,
                o.app_version,
            )
            return
        self.plan = driver.plan_write(
            o,
            self.allocation,
            fresh=o.app_id is None,
            expiration=expiration,
            topics=[o.topic] if o.topic is not None else [],
        )

    def write(self, iterator: Iterator[Any]) -> KafkaCommit:
        if self.skipped:  # a completed version: read the rows, write none
            context = TaskContext.get()
            assert context is not None
            partition = context.partitionId()
            return KafkaCommit(partition, context.attemptNumber(), -1, rows_read=_count(iterator))
        o = self.options
        name = None if o.app_id is None or o.app_version is None else (o.app_id, o.app_version)
        return write_partition(o, self.allocation, self.plan, iterator, name=name)

    def summary(self, messages: list[WriterCommitMessage | None]) -> WriteSummary:
        from pidctl.spark.kafka_driver import summarize

        o = self.options
        found = summarize(_reports(messages), o.app_id, o.app_version, skipped=self.skipped)
        if self.skipped:
            return type(found)(
                found.app_id, found.version, found.state, _rows_read(messages), 0, 0, ()
            )
        return found

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from pidctl.spark.kafka_driver import commit_version

        o = self.options
        if o.app_id is not None and o.app_version is not None and not self.skipped:
            commit_version(
                o.pidctl_bootstrap,
                o.app_id,
                o.app_version,
                budget_s=o.producer.delivery_timeout_s,
                connection=o.pidctl_connection,
            )
        log.warning(self.summary(messages).line())

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What the tasks wrote stays in Kafka (nothing here is transactional).
        if self.options.app_id is not None:
            log.warning(
                "pidctl-kafka: the job failed; rows already written stay in Kafka, and a "
                "re-run of txnAppId %r version %s writes the rest, nothing twice",
                self.options.app_id,
                self.options.app_version,
            )
        else:
            log.warning(
                "pidctl-kafka: the job failed; rows already written stay in Kafka, and a "
                "re-run without a name writes them again (delivery at-least-once)"
            )


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch is a named job version: the query id and the batch id. The tasks read
    both from Spark's task-local properties and ask pidctl for the blocks themselves (the
    driver's ``streamWriter()`` does not get them), pipelined, one round trip per task,
    asked again while pidctl restarts; ``commit()`` records the micro-batch as completed."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None
    ) -> None:
        from pidctl.spark import kafka_driver as driver

        self.options = o = KafkaSinkOptions.parse(options, default_client_id, stream=True)
        check_columns(schema, o.topic)
        self.expiration = driver.broker_expiration(o)
        self.cluster_producer_id = driver.cluster_producer_id(o)
        self.partitions = {} if o.topic is None else driver.partition_counts(o, [o.topic])

    def write(self, iterator: Iterator[Any]) -> KafkaCommit:
        from pidctl.controller.core.kafka import BLOCK_SIZE
        from pidctl.spark import kafka_driver as driver

        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if query_id is None or batch_id is None:
            raise RuntimeError("pidctl-kafka's stream writer runs only in a streaming query")
        o = self.options
        partition = context.partitionId()
        # Blocks 0..b for this partition (asked in order: every task of the batch names the
        # same version, the first to ask makes pidctl grant and record each block).
        named = driver.allocate_named(
            o.pidctl_bootstrap,
            (partition // BLOCK_SIZE + 1) * BLOCK_SIZE,
            query_id,
            int(batch_id),
            max_age_ms=self.expiration,
            budget_s=o.producer.delivery_timeout_s,
            connection=o.pidctl_connection,
        )
        if named.committed:  # a micro-batch completed before (a replay): write nothing
            return KafkaCommit(
                partition,
                context.attemptNumber(),
                -1,
                rows_read=_count(iterator),
                query_id=query_id,
            )
        driver.check_pid_range(named.allocation, self.cluster_producer_id, o.pid_headroom)
        plan = driver.WritePlan(
            self.partitions, expiration_ms=self.expiration, started_ms=int(time.time() * 1000)
        )
        return write_partition(o, named.allocation, plan, iterator, resume=True, query_id=query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from pidctl.spark.kafka_driver import commit_version, summarize

        o = self.options
        queries = {m.query_id for m in messages if isinstance(m, KafkaCommit) and m.query_id}
        for query_id in queries:
            commit_version(
                o.pidctl_bootstrap,
                query_id,
                batchId,
                budget_s=o.producer.delivery_timeout_s,
                connection=o.pidctl_connection,
            )
        found = summarize(_reports(messages), next(iter(queries), None), batchId)
        read = _rows_read(messages)
        if read:
            log.warning(
                "pidctl-kafka: query %s micro-batch %d completed before: this run wrote "
                "nothing (%d rows read)",
                next(iter(queries), "?"),
                batchId,
                read,
            )
        elif found.present:  # a replay that found rows written: Spark's count says otherwise
            log.warning(found.line())
        else:
            log.info(found.line())

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pidctl-kafka: micro-batch %d failed; its replay writes the rest", batchId)
