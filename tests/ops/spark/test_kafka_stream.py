"""``df.writeStream.format("pidctl-kafka")``: a micro-batch replayed after a restart from the
checkpoint (its commit never reached the checkpoint, as when the driver dies right after the
sink wrote) gets the same PIDs back — query id and batch id name it — and writes nothing
twice. Real Kafka, real pidctl, real SparkSession, a file source (deterministic replays)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic
from ops.testing.serverproc import ServerProcess

FILES, PER_FILE = 3, 400


def _inputs(directory: Path, files: range) -> None:
    directory.mkdir(exist_ok=True)
    for index in files:
        rows = range(index * PER_FILE, (index + 1) * PER_FILE)
        text = "".join(json.dumps({"id": i}) + "\n" for i in rows)
        (directory / f"part-{index:03}.json").write_text(text)


def _run(spark: Any, source: Path, checkpoint: Path, topic: str, kafka: str, pidctl: str) -> None:
    stream = (
        spark.readStream.schema("id LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .selectExpr("CAST(id AS STRING) AS value", "CONCAT('k', CAST(id AS STRING)) AS key")
    )
    query = (
        stream.writeStream.format("pidctl-kafka")
        .option("kafka.bootstrap.servers", kafka)
        .option("topic", topic)
        .option("pidctl.bootstrap", pidctl)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()


def test_a_replayed_micro_batch_writes_nothing_twice(
    spark: Any, kafka: KafkaNode, job_pidctl: ServerProcess, tmp_path: Path
) -> None:
    topic = new_topic(kafka.bootstrap, 3)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    _inputs(source, range(FILES))
    _run(spark, source, checkpoint, topic, kafka.bootstrap, job_pidctl.bootstrap)
    assert count(kafka.bootstrap, topic, FILES * PER_FILE) == (FILES * PER_FILE,) * 2 + (0, 0)
    # The driver "died" after the sink wrote the last micro-batch and before Spark logged its
    # commit: the restarted query replays it with the same query id and batch id.
    commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    _inputs(source, range(FILES, FILES + 1))  # and new data arrives meanwhile
    _run(spark, source, checkpoint, topic, kafka.bootstrap, job_pidctl.bootstrap)
    total = (FILES + 1) * PER_FILE
    assert count(kafka.bootstrap, topic, total) == (total, total, 0, 0)


def test_a_stream_rides_out_a_pidctl_restart(spark: Any, kafka: KafkaNode, tmp_path: Path) -> None:
    """pidctl killed while a query runs, files arriving meanwhile, pidctl started again 5 s
    later on its port: the micro-batches' tasks ask pidctl again (within the delivery
    timeout) and go on; the query never fails, and every row is there once."""
    from ops.testing.coordination import free_port
    from ops.testing.serverproc import wait_until

    port = free_port()
    controller = ServerProcess(
        tmp_path / "data", "--listen", f"127.0.0.1:{port}", "--first-producer-id", str(2**62)
    ).start()
    topic = new_topic(kafka.bootstrap, 3)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    _inputs(source, range(1))
    stream = (
        spark.readStream.schema("id LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .selectExpr("CAST(id AS STRING) AS value", "CONCAT('k', CAST(id AS STRING)) AS key")
    )
    query = (
        stream.writeStream.format("pidctl-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", topic)
        .option("pidctl.bootstrap", controller.bootstrap)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        from ops.testing.kafka_topics import written_rows

        wait_until(lambda: written_rows(kafka.bootstrap, topic) >= PER_FILE, "the first file")
        controller.kill()
        _inputs(source, range(1, 3))  # micro-batches start while pidctl is down
        time.sleep(5)
        assert query.isActive and query.exception() is None
        controller.start()
        total = 3 * PER_FILE
        wait_until(
            lambda: written_rows(kafka.bootstrap, topic) >= total or not query.isActive,
            "every file written",
            timeout=300,
        )
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
        controller.kill()
    assert count(kafka.bootstrap, topic, total) == (total, total, 0, 0)
