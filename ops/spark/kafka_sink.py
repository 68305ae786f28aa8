"""``df.write.format("pidctl-kafka")``: Spark to Kafka, every row once, with the driver's
preallocated producer ids (``df.writeStream.format("pidctl-kafka")`` too). Design and limits:
docs/spark-kafka.md.

    (df.selectExpr("CAST(id AS STRING) AS key", "payload AS value")
       .write.format("pidctl-kafka")                     # instead of "kafka"
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "orders")
       .option("pidctl.bootstrap", "127.0.0.1:9093")     # the controller
       .option("txnAppId", "nightly-orders").option("txnVersion", "20261123")  # optional
       .mode("append").save())

The input is Spark's Kafka sink's: ``value`` (string or binary, required), ``key`` (string or
binary), ``headers`` (array of struct<key string, value binary>), ``topic`` (string; the
``topic`` option wins), ``partition`` (int). Options: Spark's ``kafka.bootstrap.servers`` and
``topic``; Kafka client properties with the ``kafka.`` prefix (``security.protocol``,
``sasl.mechanism``, ``sasl.jaas.config`` with username and password, ``ssl.truststore.location``
of a PEM file, ``compression.type``, ``request.timeout.ms``, ``retries``, ``retry.backoff.ms``;
``acks`` and ``enable.idempotence`` only as all/true; the JVM producer's tuning properties are
accepted and have no effect). Ours: ``pidctl.bootstrap`` (required) and ``pidctl.``-prefixed
client properties for a secured pidctl; ``partitions`` (producer ids to preallocate, at least
the DataFrame's partitions, default 1000); ``txnAppId``/``txnVersion``; ``batchBytes`` (a record
batch's size, default 1000000); ``clientId``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from pidctl.client import AuthenticationError, SyncClient
from pidctl.controller.core.jobs import JobKey
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.protocol import requests
from pidctl.spark.allocation import (
    JOB_EPOCH,
    JobAllocation,
    PreallocationError,
    allocate_job_blocks,
    client_settings,
)
from pidctl.spark.kafka_cluster import KafkaCluster, KafkaWriteError, ProducerState
from pidctl.spark.kafka_producer import COMPRESSION, PartitionReport, ProducerSettings, TaskProducer

log = logging.getLogger("pidctl.spark")

DEFAULT_PARTITIONS = 1000
DEFAULT_BATCH_BYTES = 1_000_000
#: Kafka producer properties that tune the JVM client's batching and buffers: accepted, so a
#: job switches by changing the format name, and without effect here.
IGNORED_KAFKA_PROPERTIES = frozenset(
    {
        "linger.ms",
        "batch.size",
        "buffer.memory",
        "max.in.flight.requests.per.connection",
        "delivery.timeout.ms",
        "max.block.ms",
        "send.buffer.bytes",
        "receive.buffer.bytes",
        "max.request.size",
        "client.id",
    }
)
KAFKA_PROPERTIES = frozenset(
    {
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanism",
        "sasl.jaas.config",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "compression.type",
        "request.timeout.ms",
        "retries",
        "retry.backoff.ms",
        "acks",
        "enable.idempotence",
    }
)
#: Spark's own Kafka sink refuses these; so does this one.
SPARK_REFUSED = ("key.serializer", "value.serializer")
_JAAS_FIELD = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class KafkaSinkOptionError(ValueError):
    """A missing or invalid option or column of the sink."""


def _int_option(options: dict[str, str], name: str, default: int, least: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if not raw.strip().lstrip("-").isdigit() or int(raw) < least:
        raise KafkaSinkOptionError(f"option {name} must be an integer >= {least}, got {raw!r}")
    return int(raw)


def kafka_connection(properties: dict[str, str]) -> dict[str, Any]:
    """SyncClient's ``ssl_context``/``sasl`` from Kafka client properties (no prefix)."""
    translated = {"security.protocol": properties.get("security.protocol", "PLAINTEXT")}
    if "sasl.mechanism" in properties:
        translated["sasl.mechanism"] = properties["sasl.mechanism"]
    jaas = properties.get("sasl.jaas.config")
    if jaas is not None:
        for name, value in _JAAS_FIELD.findall(jaas):
            translated[f"sasl.{name}"] = value.replace('\\"', '"')
    store = properties.get("ssl.truststore.location")
    if store is not None:
        if properties.get("ssl.truststore.type", "PEM").upper() != "PEM":
            raise KafkaSinkOptionError(
                "kafka.ssl.truststore.type must be PEM (a JKS or PKCS12 store is Java's)"
            )
        translated["ssl.cafile"] = store
    try:
        return client_settings(translated)
    except ValueError as e:
        raise KafkaSinkOptionError(f"kafka.{e}") from None


@dataclass(frozen=True)
class KafkaSinkOptions:
    """The sink's options, checked (Spark hands them over with lower-cased names)."""

    bootstrap_servers: tuple[str, ...]
    topic: str | None
    pidctl_bootstrap: str
    pidctl_connection: dict[str, Any]
    connection: dict[str, Any]
    partitions: int
    app_id: str | None
    app_version: int | None
    client_id: str
    producer: ProducerSettings

    @classmethod
    def parse(cls, raw: dict[str, str], default_client_id: str | None) -> KafkaSinkOptions:
        """Check every option; a missing or invalid one raises KafkaSinkOptionError."""
        options = {name.lower(): value for name, value in raw.items()}
        kafka = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
        for name in SPARK_REFUSED:
            if name in kafka:
                raise KafkaSinkOptionError(
                    f"kafka.{name} is not supported: the columns are written as bytes "
                    "(cast them to string or binary), as in Spark's Kafka sink"
                )
        unknown = sorted(set(kafka) - KAFKA_PROPERTIES - IGNORED_KAFKA_PROPERTIES)
        if unknown:
            raise KafkaSinkOptionError(
                f"option kafka.{unknown[0]} is not supported by pidctl-kafka; supported: "
                + ", ".join(f"kafka.{name}" for name in sorted(KAFKA_PROPERTIES))
            )
        servers = tuple(s.strip() for s in kafka.get("bootstrap.servers", "").split(",") if s)
        if not servers:
            raise KafkaSinkOptionError('pidctl-kafka needs .option("kafka.bootstrap.servers", ...)')
        if kafka.get("acks", "all").lower() not in ("all", "-1"):
            raise KafkaSinkOptionError("kafka.acks must be all: exactly once needs acks=all")
        if kafka.get("enable.idempotence", "true").lower() != "true":
            raise KafkaSinkOptionError("kafka.enable.idempotence must be true")
        compression = kafka.get("compression.type", "none").lower()
        if compression not in COMPRESSION:
            raise KafkaSinkOptionError(
                f"kafka.compression.type must be one of {', '.join(COMPRESSION)}, "
                f"got {compression!r}"
            )
        pidctl_bootstrap = options.get("pidctl.bootstrap")
        if not pidctl_bootstrap:
            raise KafkaSinkOptionError('pidctl-kafka needs .option("pidctl.bootstrap", ...)')
        pidctl = {k[len("pidctl.") :]: v for k, v in options.items() if k.startswith("pidctl.")}
        pidctl.pop("bootstrap")
        try:
            pidctl_connection = client_settings(pidctl)
        except ValueError as e:
            raise KafkaSinkOptionError(f"pidctl.{e}") from None
        app_id = options.get("txnappid") or None
        raw_version = options.get("txnversion")
        if (app_id is None) != (raw_version is None):
            raise KafkaSinkOptionError("txnAppId and txnVersion go together: set both or neither")
        version = None
        if raw_version is not None:
            version = _int_option(options, "txnVersion", 0, least=0)
        producer = ProducerSettings(
            batch_bytes=_int_option(options, "batchBytes", DEFAULT_BATCH_BYTES),
            compression=COMPRESSION[compression],
            request_timeout_s=_int_option(kafka, "request.timeout.ms", 30_000) / 1000,
            retries=_int_option(kafka, "retries", 10, least=0),
            retry_backoff_s=_int_option(kafka, "retry.backoff.ms", 100, least=0) / 1000,
        )
        return cls(
            bootstrap_servers=servers,
            topic=options.get("topic") or None,
            pidctl_bootstrap=pidctl_bootstrap,
            pidctl_connection=pidctl_connection,
            connection=kafka_connection(kafka),
            partitions=_int_option(options, "partitions", DEFAULT_PARTITIONS),
            app_id=app_id,
            app_version=version,
            client_id=options.get("clientid") or default_client_id or "pidctl-kafka-sink",
            producer=producer,
        )

    def cluster(self) -> KafkaCluster:
        """Connections to the target cluster."""
        return KafkaCluster(
            self.bootstrap_servers,
            client_id=self.client_id,
            timeout_s=self.producer.request_timeout_s + 30,
            connection=self.connection,
        )


# -- columns ----------------------------------------------------------------------------------

_BYTES = (StringType, BinaryType)


def check_columns(schema: StructType, topic_option: str | None) -> None:
    """Spark's Kafka sink's input shape: a clear error naming the column otherwise."""
    fields = {field.name.lower(): field.dataType for field in schema.fields}
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


def _as_bytes(column: Any) -> list[Any]:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return list(column.to_pylist())


def rows_of(
    batches: Iterator[Any],
    topic_option: str | None,
    partitioner: Callable[[str, Any], list[int | None]] | None = None,
) -> Iterator[Any]:
    """(topic, partition, (key, value, headers)) of every row of Arrow record batches; with
    one topic for all rows and no ``partition`` column, ``partitioner(topic, keys)`` places
    the keyed rows a whole batch at a time."""
    for batch in batches:
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        count = batch.num_rows
        values = _as_bytes(batch.column(names["value"]))
        keys = _as_bytes(batch.column(names["key"])) if "key" in names else [None] * count
        if topic_option is not None:
            topics = [topic_option] * count
        else:
            topics = batch.column(names["topic"]).to_pylist()
        if "partition" in names:
            partitions = batch.column(names["partition"]).to_pylist()
        elif partitioner is not None and topic_option is not None and "key" in names:
            partitions = partitioner(topic_option, batch.column(names["key"]))
        else:
            partitions = [None] * count
        if "headers" in names:
            headers = [
                [(h["key"], h["value"]) for h in row or ()]
                for row in batch.column(names["headers"]).to_pylist()
            ]
        else:
            headers = [[]] * count
        for topic, partition, key, value, header in zip(
            topics, partitions, keys, values, headers, strict=True
        ):
            if topic is None:
                raise KafkaWriteError("a row's 'topic' is null and no topic option is set")
            yield topic, partition, (key, value, header)


# -- producer ids -----------------------------------------------------------------------------

#: What pidctl's refusals of a named job version mean (controller/core/jobs.py).
_KEY_REFUSALS = {
    ErrorCode.producer_fenced: "a later version of the app has run: an older one is refused",
    ErrorCode.unknown_producer_id: (
        "pidctl cannot tell that the brokers still know its PIDs' sequences: its first run is "
        "older than pidctl's job_allocation_reuse_ms (producer.id.expiration.ms), or its age "
        "is unknown (pidctl's clock is behind its record), or its record may have been lost "
        "with a damaged tail of pidctl's log; a re-run could write twice: run it as a new "
        "txnVersion"
    ),
    ErrorCode.transactional_id_authorization_failed: (
        "this principal may not write the app id (no ACL allowing Write on the AppId "
        "resource), or another principal owns it"
    ),
    ErrorCode.policy_violation: (
        "this principal already owns pidctl's max_job_app_ids_per_principal app ids"
    ),
    ErrorCode.invalid_request: (
        "pidctl refused the job's name (longer than max_job_app_id_bytes, not UTF-8, or "
        "pidctl runs in a fleet with pid_source, which serves no named job)"
    ),
}


def allocate_named(
    bootstrap: str, count: int, app_id: str, version: int, *, timeout: float = 30.0, **client: Any
) -> JobAllocation:
    """The blocks of job version ``(app_id, version)`` for ``count`` partitions: the same ones
    every time it is asked for (pidctl records them), all pipelined over one connection."""
    keys = [JobKey(app_id, version, b).client_id() for b in range(math.ceil(count / BLOCK_SIZE))]
    try:
        with SyncClient(bootstrap, client_id=keys[0], timeout=timeout, **client) as pidctl:
            answers = pidctl.pipeline([requests.allocate(-1, -1)] * len(keys), keys)
    except (OSError, AuthenticationError) as e:
        raise PreallocationError(f"pidctl at {bootstrap}: {e}") from e
    blocks = []
    for answer in answers:
        if answer.error_code:
            why = _KEY_REFUSALS.get(answer.error_code, "")
            raise PreallocationError(
                f"pidctl refused version {version} of {app_id!r}: {answer.error_code.name.upper()}"
                + (f": {why}" if why else "")
            )
        blocks.append((int(answer.producer_id_start), int(answer.producer_id_len)))
    return JobAllocation(app_id, tuple(blocks))


def foreign_producers(
    allocation: JobAllocation, found: dict[Any, list[ProducerState]], fresh: bool
) -> list[str]:
    """Active producers on the target partitions whose PID lies in the job's blocks and that
    are not the job's own: any, if the blocks are fresh; else one with another epoch or in a
    transaction (the job's PIDs always produce with epoch 0, never transactionally)."""
    ranges = [(first, first + length) for first, length in allocation.blocks]
    strangers = []
    for (topic, partition), producers in sorted(found.items()):
        for p in producers:
            if not any(first <= p.producer_id < end for first, end in ranges):
                continue
            if fresh or p.epoch != JOB_EPOCH or p.current_txn_start_offset != -1:
                strangers.append(f"{topic}-{partition}: producer {p.producer_id} epoch {p.epoch}")
    return strangers


# -- the data source --------------------------------------------------------------------------


@dataclass
class KafkaCommit(WriterCommitMessage):
    """A task's report: what it wrote to each Kafka partition."""

    spark_partition: int
    attempt: int
    producer_id: int
    partitions: list[PartitionReport]


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


def write_partition(
    options: KafkaSinkOptions,
    allocation: JobAllocation,
    batches: Iterator[Any],
    *,
    resume: bool,
) -> KafkaCommit:
    """One task: its Spark partition's rows with its PID (see kafka_producer)."""
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
            resume=resume or attempt > 0,
        )
        reports = producer.write(rows_of(batches, options.topic, producer.key_partitions))
    finally:
        cluster.close()
    return KafkaCommit(partition, attempt, producer_id, reports)


def summary(messages: list[WriterCommitMessage | None]) -> tuple[int, int, int]:
    """(rows, written by the reporting attempts, skipped as already written)."""
    reports = [r for m in messages if isinstance(m, KafkaCommit) for r in m.partitions]
    return (
        sum(r.rows for r in reports),
        sum(r.written for r in reports),
        sum(r.skipped for r in reports),
    )


class KafkaWriter(DataSourceArrowWriter):
    """Built on the driver (options, columns, producer ids, the collision check), pickled to
    every task."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None
    ) -> None:
        self.options = KafkaSinkOptions.parse(options, default_client_id)
        check_columns(schema, self.options.topic)
        o = self.options
        if o.app_id is not None and o.app_version is not None:
            self.allocation = allocate_named(
                o.pidctl_bootstrap, o.partitions, o.app_id, o.app_version, **o.pidctl_connection
            )
        else:
            self.allocation = allocate_job_blocks(
                o.pidctl_bootstrap, o.partitions, o.client_id, **o.pidctl_connection
            )
        if o.topic is not None:
            self.check_no_stranger(o.topic, fresh=o.app_id is None)

    def check_no_stranger(self, topic: str, *, fresh: bool) -> None:
        """Refuse to write when a target partition shows an active producer in the job's
        PID range that is not the job's own (docs/spark-kafka.md)."""
        cluster = self.options.cluster()
        try:
            layout = cluster.layout(topic)
            found = cluster.describe_producers((topic, p) for p in range(layout.partitions))
        finally:
            cluster.close()
        strangers = foreign_producers(self.allocation, found, fresh)
        if strangers:
            raise KafkaWriteError(
                f"refusing to write to {topic!r}: its partitions show producers in the job's "
                f"PID range that are not the job's ({'; '.join(strangers[:5])}): the cluster "
                "hands out the same PIDs as pidctl; give pidctl a range of its own "
                "(first_producer_id, docs/spark-kafka.md)"
            )

    def write(self, iterator: Iterator[Any]) -> KafkaCommit:
        return write_partition(
            self.options, self.allocation, iterator, resume=self.options.app_id is not None
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, written, skipped = summary(messages)
        log.info(
            "pidctl-kafka: %d rows, %d written by the final attempts, %d already written",
            rows,
            written,
            skipped,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What the tasks wrote stays in Kafka (nothing here is transactional): a re-run of the
        # same txnAppId/txnVersion writes the rest, and nothing twice.
        log.warning("pidctl-kafka: the job failed; rows already written stay in Kafka")


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch is a named job version: the query id and the batch id. The tasks read
    both from Spark's task-local properties and ask pidctl for the blocks themselves (the
    driver's ``streamWriter()`` does not get them), pipelined, one round trip per task."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None
    ) -> None:
        self.options = KafkaSinkOptions.parse(options, default_client_id)
        if self.options.app_id is not None:
            raise KafkaSinkOptionError(
                "a stream's writes are named by its query id and batch id: "
                "txnAppId/txnVersion apply to batch writes only"
            )
        check_columns(schema, self.options.topic)

    def write(self, iterator: Iterator[Any]) -> KafkaCommit:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if query_id is None or batch_id is None:
            raise RuntimeError("pidctl-kafka's stream writer runs only in a streaming query")
        o = self.options
        # Blocks 0..b for this partition (asked in order: every task of the batch names the
        # same version, the first to ask makes pidctl grant and record each block).
        count = (context.partitionId() // BLOCK_SIZE + 1) * BLOCK_SIZE
        allocation = allocate_named(
            o.pidctl_bootstrap, count, query_id, int(batch_id), **o.pidctl_connection
        )
        return write_partition(o, allocation, iterator, resume=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, written, skipped = summary(messages)
        log.info(
            "pidctl-kafka: micro-batch %d: %d rows, %d written, %d already written",
            batchId,
            rows,
            written,
            skipped,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pidctl-kafka: micro-batch %d failed; its replay writes the rest", batchId)
