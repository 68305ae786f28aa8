"""``format("pidctl-kafka")`` against a real Kafka broker, a real pidctl and a real local
SparkSession: every row once under task retries, re-runs of a named version, and clear errors
for bad input. Rows are counted by their unique id with a real consumer."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic, read_values
from ops.testing.serverproc import ServerProcess
from pidctl.spark.allocation import PreallocationError, allocate_job_blocks
from pidctl.spark.kafka_cluster import KafkaCluster, KafkaWriteError
from pidctl.spark.kafka_producer import COMPRESSION
from pidctl.spark.kafka_sink import KafkaSinkOptionError, KafkaWriter, PidctlKafkaSink

ROWS = 4000


def _frame(spark: Any, rows: int = ROWS, partitions: int = 2, keyed: bool = True) -> Any:
    df = spark.range(0, rows, 1, partitions)
    columns = ["CAST(id AS STRING) AS value"]
    if keyed:
        columns.append("CONCAT('k', CAST(id AS STRING)) AS key")
    return df.selectExpr(*columns)


def _writer(df: Any, kafka: KafkaNode, pidctl: ServerProcess, topic: str, fmt: str) -> Any:
    return (
        df.write.format(fmt)
        .mode("append")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", topic)
        .option("pidctl.bootstrap", pidctl.bootstrap)
        .option("partitions", "8")
        .option("batchBytes", "2000")  # many small batches: a failure lands mid-partition
    )


class FailingWriter(KafkaWriter):
    """Fails the first attempt of every task after part of its rows went out."""

    def write(self, iterator: Iterator[Any]) -> Any:
        context = TaskContext.get()
        assert context is not None
        if context.attemptNumber() == 0:
            iterator = _fail_after(iterator, 1500)
        return super().write(iterator)


def _fail_after(batches: Iterator[Any], rows: int) -> Iterator[Any]:
    """Arrow batches of 100 rows; a failure once ``rows`` rows were handed over."""
    handed = 0
    for batch in batches:
        for start in range(0, batch.num_rows, 100):
            if handed >= rows:
                raise RuntimeError("injected failure after part of the output")
            piece = batch.slice(start, 100)
            handed += piece.num_rows
            yield piece


class FailingKafkaSink(PidctlKafkaSink):
    @classmethod
    def name(cls) -> str:
        return "pidctl-kafka-failing"

    def writer(self, schema: Any, overwrite: bool) -> KafkaWriter:
        return FailingWriter(dict(self.options), schema, None)


@pytest.fixture(scope="module")
def failing(spark: Any) -> None:
    spark.dataSource.register(FailingKafkaSink)


def test_every_row_once(spark: Any, kafka: KafkaNode, pidctl: ServerProcess) -> None:
    topic = new_topic(kafka.bootstrap, 3)
    _writer(_frame(spark), kafka, pidctl, topic, "pidctl-kafka").save()
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_retried_tasks_write_nothing_twice(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess, failing: None
) -> None:
    """Each task's first attempt dies after sending part of its rows; the retry (same PID)
    asks each leader for LastSequence and sends only the rest."""
    topic = new_topic(kafka.bootstrap, 3)
    _writer(_frame(spark), kafka, pidctl, topic, "pidctl-kafka-failing").save()
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_rerun_of_a_version_writes_nothing_twice(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess
) -> None:
    """A version run twice (a re-run after a crash, say) gets the same PIDs back: the second
    run finds every row written and sends none; a new version writes again."""
    topic = new_topic(kafka.bootstrap, 3)
    for _ in range(2):
        writer = _writer(_frame(spark, keyed=False), kafka, pidctl, topic, "pidctl-kafka")
        writer.option("txnAppId", f"app-{topic}").option("txnVersion", "7").save()
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)
    writer = _writer(_frame(spark, keyed=False), kafka, pidctl, topic, "pidctl-kafka")
    writer.option("txnAppId", f"app-{topic}").option("txnVersion", "8").save()
    assert count(kafka.bootstrap, topic, ROWS).duplicates == ROWS
    with pytest.raises(Exception, match="PRODUCER_FENCED"):
        writer.option("txnVersion", "7").save()


def test_spark_partition_writes_with_its_own_pid(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess
) -> None:
    """The PIDs the brokers see are the allocation's, epoch 0, sequences from 0 per partition."""
    topic = new_topic(kafka.bootstrap, 2)
    writer = _writer(_frame(spark, rows=1000), kafka, pidctl, topic, "pidctl-kafka")
    writer.option("txnAppId", f"pids-{topic}").option("txnVersion", "1").save()
    from pidctl.spark.kafka_sink import allocate_named

    allocation = allocate_named(pidctl.bootstrap, 8, f"pids-{topic}", 1)
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    try:
        found = cluster.describe_producers([(topic, 0), (topic, 1)])
    finally:
        cluster.close()
    seen = {p.producer_id: p for producers in found.values() for p in producers}
    assert set(seen) == {allocation.producer_id(0), allocation.producer_id(1)}
    assert {p.epoch for p in seen.values()} == {0}
    total = sum(p.last_sequence + 1 for producers in found.values() for p in producers)
    assert total == 1000


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["CAST(id AS STRING) AS payload"], "needs a 'value' column"),
        (["id AS value"], "column 'value' must be string or binary, not bigint"),
        (["CAST(id AS STRING) AS value", "id AS partition"], "column 'partition' must be int"),
    ],
)
def test_bad_columns_are_named(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess, columns: list[str], message: str
) -> None:
    df = spark.range(0, 10, 1, 1).selectExpr(*columns)
    with pytest.raises(Exception, match=message):
        _writer(df, kafka, pidctl, "any", "pidctl-kafka").save()


def test_missing_topic_is_named(spark: Any, kafka: KafkaNode, pidctl: ServerProcess) -> None:
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        _writer(_frame(spark, 10), kafka, pidctl, "no-such-topic", "pidctl-kafka").save()


def test_partition_out_of_range_is_named(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess
) -> None:
    topic = new_topic(kafka.bootstrap, 2)
    df = spark.range(0, 10, 1, 1).selectExpr("CAST(id AS STRING) AS value", "5 AS partition")
    with pytest.raises(Exception, match=f"partition 5 of topic '{topic}' is out of range"):
        _writer(df, kafka, pidctl, topic, "pidctl-kafka").save()


def test_unreachable_broker_is_named(spark: Any, kafka: KafkaNode, pidctl: ServerProcess) -> None:
    from ops.testing.coordination import free_port

    dead = f"127.0.0.1:{free_port()}"
    writer = _writer(_frame(spark, 10), kafka, pidctl, "t", "pidctl-kafka")
    with pytest.raises(
        Exception, match=r"no Kafka broker of kafka\.bootstrap\.servers is reachable"
    ):
        writer.option("kafka.bootstrap.servers", dead).save()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("kafka.acks", "1", "kafka.acks must be all"),
        ("kafka.key.serializer", "x", "kafka.key.serializer is not supported"),
        ("kafka.fetch.min.bytes", "1", "kafka.fetch.min.bytes is not supported"),
        ("kafka.compression.type", "brotli", "kafka.compression.type must be one of"),
        ("txnVersion", "3", "txnAppId and txnVersion go together"),
    ],
)
def test_bad_options_are_named(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess, option: str, value: str, message: str
) -> None:
    writer = _writer(_frame(spark, 10), kafka, pidctl, "t", "pidctl-kafka")
    with pytest.raises(Exception, match=message):
        writer.option(option, value).save()


def _codecs_on_disk(kafka: KafkaNode, topic: str) -> set[int]:
    """The compression ids of the record batches in partition 0's first segment, as the broker
    wrote them (a batch: base offset, length, leader epoch, magic, CRC, then its attributes,
    whose low 3 bits are the codec)."""
    data = (kafka.directory / "data" / f"{topic}-0" / "00000000000000000000.log").read_bytes()
    codecs, at = set(), 0
    while at + 23 <= len(data):
        length = struct.unpack_from(">i", data, at + 8)[0]
        codecs.add(struct.unpack_from(">h", data, at + 21)[0] & 0x7)
        at += 12 + length
    return codecs


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_as_asked(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess, codec: str
) -> None:
    """Each codec Kafka has: the rows arrive, in batches the broker stored compressed with it."""
    topic = new_topic(kafka.bootstrap, 1)
    writer = _writer(_frame(spark, 500), kafka, pidctl, topic, "pidctl-kafka")
    writer.option("kafka.compression.type", codec).save()
    assert count(kafka.bootstrap, topic, 500) == (500, 500, 0, 0)
    assert _codecs_on_disk(kafka, topic) == {COMPRESSION[codec]}


def test_a_stranger_in_the_job_range_stops_the_job(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess
) -> None:
    """A producer with one of the job's PIDs already active on the topic (as if the
    cluster's own controller had handed it out too): the driver refuses before any task
    runs. The stranger is a raw idempotent batch with that PID and another epoch."""
    topic = new_topic(kafka.bootstrap, 1)
    # The job's block is the one after this probe's (this test process's pidctl).
    upcoming = allocate_job_blocks(pidctl.bootstrap, 1, "probe").blocks[0][0] + 1000
    _produce_as(kafka, topic, upcoming, epoch=3)
    with pytest.raises(Exception, match="producers in the job's PID range that are not the job"):
        _writer(_frame(spark, 10), kafka, pidctl, topic, "pidctl-kafka").save()
    assert read_values(kafka.bootstrap, topic) == [b"stranger"]  # the job wrote nothing


def _produce_as(kafka: KafkaNode, topic: str, producer_id: int, epoch: int) -> None:
    """One idempotent batch to partition 0 with the given PID and epoch."""
    from pidctl.spark.kafka_producer import ProducerSettings, TaskProducer

    cluster = KafkaCluster([kafka.bootstrap], client_id="stranger", timeout_s=30, connection={})
    try:
        producer = TaskProducer(cluster, producer_id, epoch, 0, ProducerSettings(), resume=False)
        producer.write([(topic, 0, (None, b"stranger", []))])
    finally:
        cluster.close()


@pytest.fixture
def short_memory(tmp_path: Path) -> Iterator[tuple[KafkaNode, ServerProcess]]:
    """A broker that forgets a silent PID after 3 s, and a pidctl whose reuse window is
    the same (as the docs say to set it)."""
    settings = {
        "producer.id.expiration.ms": "3000",
        "producer.id.expiration.check.interval.ms": "500",
    }
    with (
        KafkaNode(settings) as broker,
        ServerProcess(tmp_path / "data", "--job-allocation-reuse-ms", "3000") as controller,
    ):
        yield broker, controller


@pytest.mark.slow
def test_expired_producer_state(spark: Any, short_memory: tuple[KafkaNode, ServerProcess]) -> None:
    """A broker that forgot a PID (producer.id.expiration.ms passed) accepts it again at any
    sequence, so a re-run past that would write twice: pidctl refuses the re-run
    (job_allocation_reuse_ms, set here to the broker's expiration) with a clear error."""
    broker, controller = short_memory
    topic = new_topic(broker.bootstrap, 1)
    writer = (
        _frame(spark, 100, partitions=1)
        .write.format("pidctl-kafka")
        .mode("append")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", topic)
        .option("pidctl.bootstrap", controller.bootstrap)
        .option("txnAppId", "expiring")
        .option("txnVersion", "1")
    )
    writer.save()
    cluster = KafkaCluster([broker.bootstrap], client_id="t", timeout_s=30, connection={})
    deadline = time.monotonic() + 120
    try:
        while cluster.describe_producers([(topic, 0)])[(topic, 0)]:
            assert time.monotonic() < deadline, "the broker never expired the producer"
            time.sleep(0.5)
    finally:
        cluster.close()
    with pytest.raises(Exception, match=r"UNKNOWN_PRODUCER_ID: .*its first run is older"):
        writer.save()
    assert count(broker.bootstrap, topic, 100) == (100, 100, 0, 0)


def test_options_parse_without_spark() -> None:
    with pytest.raises(KafkaSinkOptionError, match=r"pidctl\.bootstrap"):
        from pidctl.spark.kafka_sink import KafkaSinkOptions

        KafkaSinkOptions.parse({"kafka.bootstrap.servers": "h:1"}, None)
    with pytest.raises(PreallocationError):
        allocate_job_blocks("127.0.0.1:1", 1, "x", timeout=2)
    assert KafkaWriteError.__mro__[1] is RuntimeError
