"""``pidctl kafka verify`` (ops/spark/kafka_verify.py) against a real Kafka: a version written
by pidctl-kafka is confirmed landed once; a row copied in by another producer, a sequence
written again at another epoch and a row missing from what a producer wrote are each found."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import new_topic, read_values
from ops.testing.serverproc import ServerProcess, without_hypothesis
from pidctl.spark.kafka_cluster import KafkaCluster
from pidctl.spark.kafka_options import ProducerSettings
from pidctl.spark.kafka_producer import TaskProducer
from pidctl.spark.kafka_verify import verify

ROWS = 3000


def _written(spark: Any, kafka: KafkaNode, pidctl: ServerProcess) -> tuple[str, str]:
    topic, app = new_topic(kafka.bootstrap, 3), f"verify-{uuid.uuid4().hex[:8]}"
    (
        spark.range(0, ROWS, 1, 3)
        .selectExpr("CAST(id AS STRING) AS key", "CONCAT(CAST(id AS STRING), ':v') AS value")
        .write.format("pidctl-kafka")
        .mode("append")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", topic)
        .option("pidctl.bootstrap", pidctl.bootstrap)
        .option("batchBytes", "5000")
        .option("txnAppId", app)
        .option("txnVersion", "4")
        .save()
    )
    return topic, app


def _cli(kafka: KafkaNode, topic: str, app: str, *more: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pidctl.controller.cli", "kafka", "verify"]
    command += ["--bootstrap-servers", kafka.bootstrap, "--topic", topic, "--app-id", app]
    command += ["--version", "4", *more]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=without_hypothesis({})
    )


def test_a_written_version_is_confirmed_and_a_copied_row_is_found(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    topic, app = _written(spark, kafka, job_pidctl)
    verdict = verify([kafka.bootstrap], topic, app, 4, expected_rows=ROWS)
    assert verdict.ok, verdict.lines()
    assert (verdict.rows, verdict.duplicate_rows) == (ROWS, 0)
    assert _cli(kafka, topic, app, "--rows", str(ROWS)).returncode == 0
    assert not verify([kafka.bootstrap], topic, app, 5).ok  # another version: no rows
    # A planted duplicate: one of the version's rows produced again by another producer.
    copy = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    copy.produce(topic, key=b"17", value=b"17:v", partition=0)
    copy.flush(30)
    verdict = verify([kafka.bootstrap], topic, app, 4)
    assert (verdict.ok, verdict.duplicate_rows, verdict.rows) == (False, 1, ROWS)
    done = _cli(kafka, topic, app, "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["duplicate_rows"] == 1


def test_a_sequence_written_again_at_another_epoch_is_found(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    topic, app = _written(spark, kafka, job_pidctl)
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    try:
        found = cluster.describe_producers([(topic, 0)])[(topic, 0)]
        producer_id = found[0].producer_id
        again = TaskProducer(cluster, producer_id, 1, 0, ProducerSettings(), resume=False)
        row = pa.RecordBatch.from_arrays(
            [pa.array([b"again"]), pa.array([0], pa.int32())], names=["value", "partition"]
        )
        again.write(iter([row]), topic)  # epoch 1 starts at sequence 0 again
    finally:
        cluster.close()
    assert b"again" in read_values(kafka.bootstrap, topic)
    verdict = verify([kafka.bootstrap], topic, app, 4)
    assert verdict.repeated == 1 and not verdict.ok


def test_rows_deleted_from_a_partition_are_missing(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    """The first 5 records of partition 0 deleted (DeleteRecords, as retention would): the
    sequences before the first one left are missing."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, app = _written(spark, kafka, job_pidctl)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 5)]).values():
        future.result(timeout=60)
    verdict = verify([kafka.bootstrap], topic, app, 4, expected_rows=ROWS)
    assert (verdict.missing, verdict.rows, verdict.ok) == (5, ROWS - 5, False)
    assert "NOT landed once" in verdict.lines()[0]


def test_a_bad_property_is_a_usage_error(kafka: KafkaNode) -> None:
    done = _cli(kafka, "t", "a", "--property", "no-equals-sign")
    assert done.returncode != 0 and "KEY=VALUE" in done.stderr
    with pytest.raises(Exception):  # noqa: B017 (the library call's own error)
        verify([kafka.bootstrap], "no-such-topic-x", "a", 1)
