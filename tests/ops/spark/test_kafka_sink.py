"""``format("pidctl-kafka")`` and ``write_kafka`` against a real Kafka broker, a real pidctl and a
real local SparkSession: every row once under task retries and re-runs; a version all or
nothing — a completed one written once whatever a re-run brings, an unfinished one re-run with
other rows (another data set, a non-deterministic input, more topic partitions) refused
before a row is written; a PID range inside the cluster's refused; clear errors for bad
input. Rows are counted by their unique id with a real consumer."""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions
from pyspark import TaskContext

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic, read_values, written_rows
from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.spark.kafka_cluster import KafkaCluster, KafkaWriteError
from pidctl.spark.kafka_options import COMPRESSION, KafkaSinkOptionError, KafkaSinkOptions
from pidctl.spark.kafka_producer import RowsDiffer
from pidctl.spark.kafka_sink import KafkaWriter, PidctlKafkaSink
from pidctl.spark.kafka_write import write_kafka

ROWS = 4000


def _frame(
    spark: Any, rows: int = ROWS, partitions: int = 2, keyed: bool = True, tag: str = ""
) -> Any:
    df = spark.range(0, rows, 1, partitions)
    columns = [f"CONCAT(CAST(id AS STRING), ':{tag}') AS value"]
    if keyed:
        columns.append("CONCAT('k', CAST(id AS STRING)) AS key")
    return df.selectExpr(*columns)


def _options(kafka: KafkaNode, pidctl: ServerProcess, topic: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": kafka.bootstrap,
        "topic": topic,
        "pidctl.bootstrap": pidctl.bootstrap,
        "partitions": "8",
        "batchBytes": "2000",  # many small batches: a failure lands mid-partition
    }


def _writer(
    df: Any,
    kafka: KafkaNode,
    pidctl: ServerProcess,
    topic: str,
    fmt: str = "pidctl-kafka",
    *,
    app: str | None = None,
    version: int = 1,
) -> Any:
    writer = df.write.format(fmt).mode("append").options(**_options(kafka, pidctl, topic))
    if app is None:
        return writer.option("delivery", "at-least-once")
    return writer.option("txnAppId", app).option("txnVersion", str(version))


def _app() -> str:
    return f"app-{uuid.uuid4().hex[:8]}"


class FailingWriter(KafkaWriter):
    """Fails after part of its rows went out: the first attempt of every task, or (``every``
    in the options) every attempt, so that the job fails and its version stays unfinished."""

    def write(self, iterator: Iterator[Any]) -> Any:
        context = TaskContext.get()
        assert context is not None
        if context.attemptNumber() == 0 or getattr(self, "every", False):
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
        writer = FailingWriter(dict(self.options), schema, None)
        writer.every = self.options.get("failevery") == "true"  # type: ignore[attr-defined]
        return writer


@pytest.fixture(scope="module")
def failing(spark: Any) -> None:
    spark.dataSource.register(FailingKafkaSink)


def _unfinished(
    spark: Any, df: Any, kafka: KafkaNode, pidctl: ServerProcess, topic: str, app: str
) -> int:
    """Version 1 of ``app`` written in part, its job failed: the rows it left in the topic."""
    writer = _writer(df, kafka, pidctl, topic, "pidctl-kafka-failing", app=app)
    with pytest.raises(Exception, match="injected failure"):
        writer.option("failEvery", "true").save()
    left = _settled_rows(spark, kafka, topic)
    assert left > 0
    return left


#: How long a killed task's Python worker may go on (``spark.python.task.killTimeout``).
PYTHON_KILL_TIMEOUT_S = 2.0


def _settled_rows(spark: Any, kafka: KafkaNode, topic: str) -> int:
    """The topic's rows once a failed job's other tasks are gone: the job fails on its first
    task's last attempt while the other task may still be writing, until Spark kills it (its
    Python worker up to ``PYTHON_KILL_TIMEOUT_S`` later)."""
    tracker = spark.sparkContext.statusTracker()
    wait_until(lambda: not tracker.getActiveStageIds(), "the failed job's stages ended", 60)
    last = [-1]

    def unchanged() -> bool:
        now = written_rows(kafka.bootstrap, topic)
        settled, last[0] = now == last[0], now
        return settled

    wait_until(unchanged, "the topic's rows settled", 60, poll=PYTHON_KILL_TIMEOUT_S + 0.5)
    return last[0]


def test_every_row_once(spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess) -> None:
    topic, app = new_topic(kafka.bootstrap, 3), _app()
    _writer(_frame(spark), kafka, job_pidctl, topic, app=app).save()
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_a_run_without_a_name_is_refused_unless_at_least_once_is_chosen(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    topic = new_topic(kafka.bootstrap, 2)
    writer = _frame(spark).write.format("pidctl-kafka").mode("append")
    with pytest.raises(Exception, match="exactly once across driver failures only under a name"):
        writer.options(**_options(kafka, job_pidctl, topic)).save()
    assert written_rows(kafka.bootstrap, topic) == 0
    _writer(_frame(spark), kafka, job_pidctl, topic).save()  # delivery at-least-once
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_retried_tasks_write_nothing_twice(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, failing: None
) -> None:
    """Each task's first attempt dies after sending part of its rows; the retry (same PID)
    checks what its PID wrote and sends only the rest."""
    topic = new_topic(kafka.bootstrap, 3)
    _writer(_frame(spark), kafka, job_pidctl, topic, "pidctl-kafka-failing", app=_app()).save()
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_a_completed_version_writes_nothing_whatever_its_rerun_brings(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    """Version 7 completed; a job naming version 7 again with another data set writes
    nothing and says so (it had written 3,807 rows of its own and dropped the rest); an
    older version likewise; a newer version writes."""
    topic, app = new_topic(kafka.bootstrap, 3), _app()
    _writer(_frame(spark), kafka, job_pidctl, topic, app=app, version=7).save()
    other = _frame(spark, rows=ROWS * 2, tag="other-data")
    _writer(other, kafka, job_pidctl, topic, app=app, version=7).save()
    _writer(other, kafka, job_pidctl, topic, app=app, version=3).save()
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)
    result = write_kafka(other, _options(kafka, job_pidctl, topic), txnAppId=app, txnVersion=7)
    assert (result.state, result.written) == ("skipped", 0)
    _writer(_frame(spark), kafka, job_pidctl, topic, app=app, version=8).save()
    assert count(kafka.bootstrap, topic, ROWS).duplicates == ROWS


def test_an_unfinished_version_rerun_with_other_data_is_refused_before_a_row_is_written(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, failing: None
) -> None:
    """Version 1's job failed part way. Its re-run with another data set: write_kafka's check
    job finds every partition's rows differ and writes nothing; the data source's tasks
    refuse too (each before it sends). The re-run with the first data set completes it."""
    topic, app = new_topic(kafka.bootstrap, 3), _app()
    left = _unfinished(spark, _frame(spark), kafka, job_pidctl, topic, app)
    other = _frame(spark, tag="another data set")
    with pytest.raises(RowsDiffer, match="nothing written"):
        write_kafka(other, _options(kafka, job_pidctl, topic), txnAppId=app, txnVersion=1)
    assert written_rows(kafka.bootstrap, topic) == left
    with pytest.raises(Exception, match="are not the ones producer"):
        _writer(_frame(spark, partitions=1, tag="x"), kafka, job_pidctl, topic, app=app).save()
    assert written_rows(kafka.bootstrap, topic) == left
    result = write_kafka(
        _frame(spark), _options(kafka, job_pidctl, topic), txnAppId=app, txnVersion=1
    )
    assert (result.state, result.rows, result.written + result.present) == (
        "written",
        ROWS,
        ROWS,
    )
    assert result.present == left
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_a_non_deterministic_rerun_is_refused(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, failing: None
) -> None:
    """``where(rand() < 0.5)``: the re-run (a new DataFrame, as a new driver builds: a new
    seed) samples other rows; refused before writing."""
    topic, app = new_topic(kafka.bootstrap, 2), _app()

    def sampled() -> Any:
        return _frame(spark, rows=ROWS * 2).where("rand() < 0.5")

    left = _unfinished(spark, sampled(), kafka, job_pidctl, topic, app)
    with pytest.raises(RowsDiffer, match="differ from what the version's first run wrote"):
        write_kafka(sampled(), _options(kafka, job_pidctl, topic), txnAppId=app, txnVersion=1)
    assert written_rows(kafka.bootstrap, topic) == left


def test_partitions_added_before_a_rerun_are_refused_before_any_task(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, failing: None
) -> None:
    topic, app = new_topic(kafka.bootstrap, 3), _app()
    left = _unfinished(spark, _frame(spark), kafka, job_pidctl, topic, app)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=60)
    time.sleep(0)  # (metadata is asked afresh by the next write)
    with pytest.raises(Exception, match="had 3 partitions; it has 5 now"):
        _writer(_frame(spark), kafka, job_pidctl, topic, app=app).save()
    with pytest.raises(KafkaWriteError, match="had 3 partitions; it has 5 now"):
        write_kafka(_frame(spark), _options(kafka, job_pidctl, topic), txnAppId=app, txnVersion=1)
    assert written_rows(kafka.bootstrap, topic) == left


def test_a_pid_range_inside_the_clusters_is_refused_before_any_row(
    spark: Any, kafka: KafkaNode, tmp_path: Path
) -> None:
    """A pidctl handing out PIDs from 0, as the cluster's own controller does: refused on a
    fresh topic, where no colliding producer is visible yet."""
    with ServerProcess(tmp_path / "data") as low:
        topic = new_topic(kafka.bootstrap, 2)
        with pytest.raises(Exception, match="are not above the cluster's own"):
            _writer(_frame(spark), kafka, low, topic, app=_app()).save()
    assert written_rows(kafka.bootstrap, topic) == 0


def test_write_kafka_returns_what_it_wrote(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    topic, app = new_topic(kafka.bootstrap, 2), _app()
    result = write_kafka(
        _frame(spark), _options(kafka, job_pidctl, topic), txnAppId=app, txnVersion=5
    )
    assert (result.state, result.rows, result.written, result.present) == ("written", ROWS, ROWS, 0)
    assert {p.partition for p in result.partitions} == {0, 1}
    assert sum(p.written for p in result.partitions) == ROWS
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_spark_partition_writes_with_its_own_pid(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    """The PIDs the brokers see are the allocation's, epoch 0, sequences from 0 per partition."""
    from pidctl.spark.kafka_driver import allocate_named

    topic, app = new_topic(kafka.bootstrap, 2), _app()
    _writer(_frame(spark, rows=1000), kafka, job_pidctl, topic, app=app).save()
    named = allocate_named(job_pidctl.bootstrap, 8, app, 1)
    assert named.committed
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    try:
        found = cluster.describe_producers([(topic, 0), (topic, 1)])
    finally:
        cluster.close()
    seen = {p.producer_id: p for producers in found.values() for p in producers}
    allocation = named.allocation
    assert set(seen) == {allocation.producer_id(0), allocation.producer_id(1)}
    assert {p.epoch for p in seen.values()} == {0}
    assert sum(p.last_sequence + 1 for producers in found.values() for p in producers) == 1000


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (["CAST(id AS STRING) AS payload"], "needs a 'value' column"),
        (["id AS value"], "column 'value' must be string or binary, not bigint"),
        (["CAST(id AS STRING) AS value", "id AS partition"], "column 'partition' must be int"),
    ],
)
def test_bad_columns_are_named(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, columns: list[str], message: str
) -> None:
    df = spark.range(0, 10, 1, 1).selectExpr(*columns)
    with pytest.raises(Exception, match=message):
        _writer(df, kafka, job_pidctl, "any").save()


def test_missing_topic_is_named(spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess) -> None:
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        _writer(_frame(spark, 10), kafka, job_pidctl, "no-such-topic").save()


def test_partition_out_of_range_is_named(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    topic = new_topic(kafka.bootstrap, 2)
    df = spark.range(0, 10, 1, 1).selectExpr("CAST(id AS STRING) AS value", "5 AS partition")
    with pytest.raises(Exception, match=f"partition 5 of topic '{topic}' is out of range"):
        _writer(df, kafka, job_pidctl, topic).save()


def test_unreachable_broker_is_named(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    from ops.testing.coordination import free_port

    dead = f"127.0.0.1:{free_port()}"
    writer = _writer(_frame(spark, 10), kafka, job_pidctl, "t")
    writer = writer.option("kafka.delivery.timeout.ms", "30000")  # the budget of asking again
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
        ("kafka.delivery.timeout.ms", "10", "must be at least kafka.request.timeout.ms"),
        ("delivery", "maybe", "option delivery must be"),
        ("txnVersion", "3", "txnAppId and txnVersion go together"),
    ],
)
def test_bad_options_are_named(
    spark: Any,
    kafka: KafkaNode,
    job_pidctl: ServerProcess,
    option: str,
    value: str,
    message: str,
) -> None:
    writer = _writer(_frame(spark, 10), kafka, job_pidctl, "t")
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
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, codec: str
) -> None:
    """Each codec Kafka has: the rows arrive, in batches the broker stored compressed with it."""
    topic = new_topic(kafka.bootstrap, 1)
    writer = _writer(_frame(spark, 500), kafka, job_pidctl, topic).option("batchBytes", "100000")
    writer.option("kafka.compression.type", codec).save()
    assert count(kafka.bootstrap, topic, 500) == (500, 500, 0, 0)
    assert _codecs_on_disk(kafka, topic) == {COMPRESSION[codec]}


def test_a_stranger_in_the_job_range_stops_the_job(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    """A producer with one of the job's PIDs already active on the topic (as if another
    allocator had handed it out too): the driver refuses before any task runs. The
    stranger is a raw idempotent batch with that PID and another epoch."""
    from pidctl.spark.kafka_driver import allocate_unnamed

    topic = new_topic(kafka.bootstrap, 1)
    # The job's block is the one after this probe's (this test process's pidctl).
    upcoming = allocate_unnamed(job_pidctl.bootstrap, 1, "probe").blocks[0][0] + 1000
    _produce_as(kafka, topic, upcoming, epoch=3)
    with pytest.raises(Exception, match="producers in the job's PID range that are not the job"):
        _writer(_frame(spark, 10), kafka, job_pidctl, topic).save()
    assert read_values(kafka.bootstrap, topic) == [b"stranger"]  # the job wrote nothing


def _produce_as(kafka: KafkaNode, topic: str, producer_id: int, epoch: int) -> None:
    """One idempotent batch to partition 0 with the given PID and epoch."""
    import pyarrow as pa

    from pidctl.spark.kafka_options import ProducerSettings
    from pidctl.spark.kafka_producer import TaskProducer

    cluster = KafkaCluster([kafka.bootstrap], client_id="stranger", timeout_s=30, connection={})
    try:
        producer = TaskProducer(cluster, producer_id, epoch, 0, ProducerSettings(), resume=False)
        rows = pa.RecordBatch.from_arrays(
            [pa.array([b"stranger"]), pa.array([0], pa.int32())], names=["value", "partition"]
        )
        producer.write(iter([rows]), topic)
    finally:
        cluster.close()


@pytest.fixture
def short_memory(tmp_path: Path) -> Iterator[tuple[KafkaNode, ServerProcess]]:
    """A broker that forgets a silent PID after 10 s (long enough for the first run's task
    attempts on a busy machine: a retry past it is refused as it should be); pidctl as
    shipped (its reuse window a day): the job reads the brokers' setting and sends it to
    pidctl with its name."""
    settings = {
        "producer.id.expiration.ms": "10000",
        "producer.id.expiration.check.interval.ms": "500",
    }
    with (
        KafkaNode(settings) as broker,
        ServerProcess(tmp_path / "data", "--first-producer-id", str(2**62)) as controller,
    ):
        yield broker, controller


@pytest.mark.slow
def test_the_brokers_expiration_is_read_and_bounds_a_rerun(
    spark: Any, failing: None, short_memory: tuple[KafkaNode, ServerProcess]
) -> None:
    """A broker that forgot a PID (producer.id.expiration.ms passed) accepts it again at any
    sequence, so a re-run past that would write twice: the driver read the brokers' 10 s
    (DescribeConfigs) and pidctl refuses the re-run with it, though its own window is a
    day."""
    broker, controller = short_memory
    topic, app = new_topic(broker.bootstrap, 1), _app()
    left = _unfinished(spark, _frame(spark, 4000, partitions=1), broker, controller, topic, app)
    cluster = KafkaCluster([broker.bootstrap], client_id="t", timeout_s=30, connection={})
    deadline = time.monotonic() + 120
    try:
        while cluster.describe_producers([(topic, 0)])[(topic, 0)]:
            assert time.monotonic() < deadline, "the broker never expired the producer"
            time.sleep(0.5)
    finally:
        cluster.close()
    with pytest.raises(Exception, match="UNKNOWN_PRODUCER_ID"):
        _writer(_frame(spark, 4000, partitions=1), broker, controller, topic, app=app).save()
    assert written_rows(broker.bootstrap, topic) == left


def test_options_parse_without_spark() -> None:
    with pytest.raises(KafkaSinkOptionError, match=r"pidctl\.bootstrap"):
        KafkaSinkOptions.parse({"kafka.bootstrap.servers": "h:1"}, None)
    parsed = KafkaSinkOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "pidctl.bootstrap": "p:2",
            "txnAppId": "a",
            "txnVersion": "3",
            "kafka.delivery.timeout.ms": "60000",
            "kafka.retry.backoff.max.ms": "500",
        },
        None,
    )
    assert (parsed.app_id, parsed.app_version, parsed.delivery) == ("a", 3, "exactly-once")
    assert parsed.producer.delivery_timeout_s == 60.0
    assert parsed.producer.retry_backoff_max_s == 0.5
    assert KafkaWriteError.__mro__[1] is RuntimeError
