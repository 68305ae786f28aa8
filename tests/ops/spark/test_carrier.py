"""pidctl-kafka's JVM carrier (ops/spark/carrier.py, ops/spark/jvm/) against a real Kafka, a real
pidctl and the test session's SparkSession, which has it on its class path: it writes the
rows the Python tasks write, in the same places, stamped with the same fingerprints (the
verifier recomputes them from the data); it resumes what another attempt wrote and refuses
rows that differ from it before sending any."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic, written_rows
from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.spark import carrier
from pidctl.spark.kafka_cluster import KafkaCluster
from pidctl.spark.kafka_driver import WritePlan, allocate_unnamed
from pidctl.spark.kafka_options import KafkaSinkOptions
from pidctl.spark.kafka_verify import verify
from pidctl.spark.kafka_write import write_kafka

ROWS = 6000


def _frame(spark: Any, tag: str = "") -> Any:
    """Keyed rows, rows without a key (placed sticky), a partition column for some, and
    headers: every way a row is placed."""
    return spark.range(0, ROWS, 1, 3).selectExpr(
        "CASE WHEN id % 5 = 0 THEN NULL ELSE CONCAT('k', CAST(id AS STRING)) END AS key",
        f"CONCAT(CAST(id AS STRING), ':{tag}', REPEAT('y', CAST(id % 40 AS INT))) AS value",
        "CASE WHEN id % 7 = 0 THEN 1 ELSE NULL END AS partition",
        "CASE WHEN id % 3 = 0 THEN ARRAY(NAMED_STRUCT('key', 'h', 'value', CAST('v' AS BINARY)))"
        " ELSE ARRAY() END AS headers",
    )


def _options(kafka: KafkaNode, pidctl: ServerProcess, topic: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": kafka.bootstrap,
        "topic": topic,
        "pidctl.bootstrap": pidctl.bootstrap,
        "batchBytes": "20000",
    }


def _rows_by_place(kafka: KafkaNode, topic: str) -> dict[tuple[int, int], list[tuple[Any, ...]]]:
    """Per (Kafka partition, producer's rank among the partition's producers by id), the rows
    (key, value, headers without the stamp) in sequence order."""
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    found: dict[tuple[int, int], list[tuple[Any, ...]]] = defaultdict(list)
    try:
        for partition in range(cluster.layout(topic).partitions):
            by_producer: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
            for batch in cluster.batches((topic, partition), 0):
                for r in batch.records():
                    headers = tuple(h for h in r.headers if h[0] != "pidctl.fp")
                    by_producer[batch.producer_id].append((r.key, r.value, headers))
            for rank, producer in enumerate(sorted(by_producer)):
                found[(partition, rank)] = by_producer[producer]
    finally:
        cluster.close()
    return found


def test_the_carrier_writes_what_the_python_tasks_write(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    assert carrier.available(spark)
    jvm_topic, py_topic = new_topic(kafka.bootstrap, 4), new_topic(kafka.bootstrap, 4)
    app = f"carrier-{uuid.uuid4().hex[:8]}"
    result = write_kafka(
        _frame(spark), _options(kafka, job_pidctl, jvm_topic), txnAppId=app, txnVersion=1
    )
    assert (result.state, result.rows, result.written) == ("written", ROWS, ROWS)
    (
        _frame(spark)
        .write.format("pidctl-kafka")
        .mode("append")
        .options(**_options(kafka, job_pidctl, py_topic))
        .option("txnAppId", f"{app}-python")
        .option("txnVersion", "1")
        .save()
    )
    assert count(kafka.bootstrap, jvm_topic, ROWS) == (ROWS, ROWS, 0, 0)
    assert _rows_by_place(kafka, jvm_topic) == _rows_by_place(kafka, py_topic)
    # The carrier's stamps are the fingerprints of the rows as Python defines them.
    verdict = verify([kafka.bootstrap], jvm_topic, app, 1, expected_rows=ROWS)
    assert verdict.ok and verdict.differing == 0, verdict.lines()


def test_the_carrier_resumes_what_was_written_and_refuses_other_rows(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    """Rows of Spark partition 0 written in part by the Python producer with the PID; the
    carrier told that partition resumes: the same rows go on from there; other rows are
    refused before anything is sent."""
    import pyarrow as pa

    from pidctl.spark.kafka_options import ProducerSettings
    from pidctl.spark.kafka_producer import TaskProducer

    topic = new_topic(kafka.bootstrap, 2)
    allocation = allocate_unnamed(job_pidctl.bootstrap, 1, "carrier-test")
    df = spark.range(0, ROWS, 1, 1).selectExpr(
        "CONCAT('k', CAST(id AS STRING)) AS key", "CONCAT(CAST(id AS STRING), ':x') AS value"
    )
    first = pa.RecordBatch.from_pylist(
        [{"key": f"k{i}", "value": f"{i}:x"} for i in range(ROWS // 3)]
    )
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    try:
        settings = ProducerSettings(batch_bytes=20000)
        producer = TaskProducer(cluster, allocation.producer_id(0), 0, 0, settings, resume=False)
        producer.write(iter([first]), topic)
    finally:
        cluster.close()
    before = written_rows(kafka.bootstrap, topic)
    options = KafkaSinkOptions.parse(
        {**_options(kafka, job_pidctl, topic), "delivery": "at-least-once"}, None
    )
    plan = WritePlan(
        {topic: 2}, frozenset({0}), started_ms=0, expiration_ms=86_400_000, expected={0: []}
    )
    other = df.selectExpr("key", "CONCAT(value, '!') AS value")
    with pytest.raises(Exception, match="are not the ones producer"):
        carrier.write(other, *carrier.plan_json(options, allocation, plan, None))
    assert written_rows(kafka.bootstrap, topic) == before
    reports = carrier.write(df, *carrier.plan_json(options, allocation, plan, None))
    assert sum(r["skipped"] for r in reports) == ROWS // 3
    assert sum(r["written"] for r in reports) == ROWS - ROWS // 3
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


def test_a_carrier_task_retried_after_a_failure_mid_write_writes_nothing_twice(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess
) -> None:
    """The input of each task's first attempt fails after part of its rows went out (a
    Python step upstream, in the same stage): the carrier's retried task asks what its PID
    wrote, checks it against the stamps, and writes the rest."""
    topic, app = new_topic(kafka.bootstrap, 3), f"retried-{uuid.uuid4().hex[:8]}"

    def failing_first_attempt(batches: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        handed = 0
        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                if context.attemptNumber() == 0 and handed >= 1500:
                    raise RuntimeError("injected failure after part of the output")
                piece = batch.slice(start, 100)
                handed += piece.num_rows
                yield piece

    df = spark.range(0, ROWS, 1, 2)
    df = df.mapInArrow(failing_first_attempt, df.schema).selectExpr(
        "CONCAT('k', CAST(id AS STRING)) AS key", "CONCAT(CAST(id AS STRING), ':r') AS value"
    )
    options = {**_options(kafka, job_pidctl, topic), "batchBytes": "2000"}
    result = write_kafka(df, options, txnAppId=app, txnVersion=1)
    assert result.present > 0  # the retries found rows their first attempts wrote
    assert (result.rows, result.written + result.present) == (ROWS, ROWS)
    assert count(kafka.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)


@pytest.mark.slow
def test_a_carrier_task_started_while_the_broker_is_down_waits_for_it(
    spark: Any, job_pidctl: ServerProcess, tmp_path: Path
) -> None:
    """The broker is SIGKILLed after the driver's checks and before the tasks' first row,
    and started again 3 s later: each task's first Metadata asks again, backing off, within
    the delivery timeout (it used to fail at once, and Spark ran the task again)."""
    asked, killed = tmp_path / "task-started", tmp_path / "broker-killed"

    def after_the_outage_began(batches: Any) -> Any:
        from ops.testing.serverproc import wait_until

        asked.touch()
        wait_until(killed.exists, "the broker killed", timeout=120)
        yield from batches

    with KafkaNode() as node:
        topic, app = new_topic(node.bootstrap, 2), f"outage-{uuid.uuid4().hex[:8]}"

        def outage() -> None:
            wait_until(asked.exists, "a task started", timeout=300)
            node.kill()
            killed.touch()
            time.sleep(3)  # the outage the tasks' first rows meet
            node.restart()

        broker = threading.Thread(target=outage)
        broker.start()
        try:
            df = spark.range(0, ROWS, 1, 2)
            df = df.mapInArrow(after_the_outage_began, df.schema).selectExpr(
                "CONCAT('k', CAST(id AS STRING)) AS key",
                "CONCAT(CAST(id AS STRING), ':o') AS value",
            )
            result = write_kafka(df, _options(node, job_pidctl, topic), txnAppId=app, txnVersion=1)
        finally:
            broker.join(300)
        assert (result.rows, result.written) == (ROWS, ROWS)
        assert count(node.bootstrap, topic, ROWS) == (ROWS, ROWS, 0, 0)
