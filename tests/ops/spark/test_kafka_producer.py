"""One task's producer (ops/spark/kafka_producer.py) against a real Kafka, without Spark: every
row once whatever attempt wrote first; a failure while other batches are in flight resolved
on the other connection; a broker killed and restarted mid-write ridden out within the
delivery timeout; rows that differ from what the PID wrote refused before anything is sent.
Rows are counted by their unique id with a real consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic, written_rows
from ops.testing.serverproc import wait_until
from pidctl.spark.kafka_cluster import KafkaCluster, KafkaWriteError
from pidctl.spark.kafka_options import ProducerSettings
from pidctl.spark.kafka_producer import PartitionReport, RowsDiffer, TaskProducer

#: PIDs far above the test broker's own (which start at 0), one range per test.
BASE = 2**62
SMALL = ProducerSettings(batch_bytes=4000)


def _rows(ids: range, per: int = 1000, tag: str = "") -> Iterator[pa.RecordBatch]:
    for start in range(ids.start, ids.stop, per):
        chunk = range(start, min(start + per, ids.stop))
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([f"k{i}" for i in chunk]),
                pa.array([f"{i}:{tag}{'x' * 20}" for i in chunk]),
            ],
            names=["key", "value"],
        )


def _cluster(kafka: KafkaNode) -> KafkaCluster:
    return KafkaCluster([kafka.bootstrap], client_id="test", timeout_s=30, connection={})


def _write(
    kafka: KafkaNode,
    topic: str,
    pid: int,
    rows: Iterator[pa.RecordBatch],
    *,
    resume: bool = False,
    settings: ProducerSettings = SMALL,
) -> list[PartitionReport]:
    cluster = _cluster(kafka)
    try:
        producer = TaskProducer(cluster, pid, 0, 0, settings, resume=resume)
        return producer.write(rows, topic)
    finally:
        cluster.close()


def test_a_retried_attempt_writes_only_what_is_missing(kafka: KafkaNode) -> None:
    topic = new_topic(kafka.bootstrap, 3)
    _write(kafka, topic, BASE + 1, _rows(range(3000)))  # the first attempt: a prefix
    reports = _write(kafka, topic, BASE + 1, _rows(range(10_000)), resume=True)
    assert sum(r.skipped for r in reports) == 3000
    assert sum(r.written for r in reports) == 7000
    assert count(kafka.bootstrap, topic, 10_000) == (10_000, 10_000, 0, 0)


def test_a_failure_while_batches_are_in_flight_is_resolved_on_the_other_connection(
    kafka: KafkaNode,
) -> None:
    """A speculative copy wrote partition 0 ahead, in other batches: the original's batches
    there fail OUT_OF_ORDER_SEQUENCE_NUMBER while its batches of the other partitions are in
    flight on the same connection. It asks LastSequence on its question connection (once
    the answer read there was a Produce response), skips what the copy wrote, and goes on."""
    topic = new_topic(kafka.bootstrap, 2)
    copy = ProducerSettings(batch_bytes=7000)  # other batch boundaries than the original's
    first_half = [b for b in _rows(range(20_000)) if True]
    # The copy: every row of partition 0 (placed as the original places them).
    cluster = _cluster(kafka)
    try:
        placing = TaskProducer(cluster, BASE + 2, 0, 0, copy, resume=False)
        placed = [
            batch.filter(
                pa.array(placing._place(topic, batch.column(0), None, batch.num_rows) == 0)
            )
            for batch in first_half
        ]
        written = TaskProducer(cluster, BASE + 2, 0, 0, copy, resume=False).write(
            iter(placed), topic
        )
    finally:
        cluster.close()
    ahead = sum(r.written for r in written)
    assert ahead > 0 and all(r.partition == 0 for r in written)
    reports = _write(kafka, topic, BASE + 2, _rows(range(20_000)))
    by_partition = {r.partition: r for r in reports}
    assert by_partition[0].skipped > 0  # found written by the copy, after a failed batch
    assert sum(r.written + r.skipped for r in reports) == 20_000
    assert count(kafka.bootstrap, topic, 20_000) == (20_000, 20_000, 0, 0)


class _Unanswered:
    """A broker connection that takes Produce requests and then breaks without delivering
    them: what a task's first connection to a broker that restarts under it does."""

    def send_parts(self, *_: object) -> None:
        pass

    def receive(self) -> None:
        raise OSError("connection reset (test)")

    def close(self) -> None:
        pass


def test_a_partitions_first_batch_is_answered_before_its_second_is_sent(
    kafka: KafkaNode,
) -> None:
    """A leader takes a producer id it has not seen at any sequence: were a later batch
    sent while the first is unanswered, and the first then lost, the later one would be
    taken, LastSequence would show the first as written, and its rows would be skipped,
    never written. The task's first connection here loses what it is given; every row must
    still be written once."""
    topic = new_topic(kafka.bootstrap, 1)
    cluster = _cluster(kafka)
    real_producer, real_drop = cluster.producer, cluster.drop
    dropped: list[int] = []

    def producer(broker_id: int) -> object:
        return real_producer(broker_id) if dropped else _Unanswered()

    def drop(broker_id: int) -> None:
        dropped.append(broker_id)
        real_drop(broker_id)

    cluster.producer, cluster.drop = producer, drop  # type: ignore[method-assign,assignment]
    try:
        reports = TaskProducer(cluster, BASE + 9, 0, 0, SMALL, resume=False).write(
            _rows(range(5000)), topic
        )
    finally:
        cluster.close()
    assert dropped  # the first connection broke
    assert sum(r.written for r in reports) == 5000
    assert count(kafka.bootstrap, topic, 5000) == (5000, 5000, 0, 0)


def test_rows_that_differ_from_what_the_pid_wrote_are_refused_before_anything_is_sent(
    kafka: KafkaNode,
) -> None:
    topic = new_topic(kafka.bootstrap, 3)
    _write(kafka, topic, BASE + 3, _rows(range(2000)))
    before = written_rows(kafka.bootstrap, topic)
    with pytest.raises(RowsDiffer, match="are not the ones producer"):
        _write(kafka, topic, BASE + 3, _rows(range(5000), tag="other"), resume=True)
    assert written_rows(kafka.bootstrap, topic) == before
    # Fewer rows than were written: not the same rows either.
    with pytest.raises(RowsDiffer):
        _write(kafka, topic, BASE + 3, _rows(range(10)), resume=True)
    assert written_rows(kafka.bootstrap, topic) == before
    # The same rows go on.
    _write(kafka, topic, BASE + 3, _rows(range(5000)), resume=True)
    assert count(kafka.bootstrap, topic, 5000) == (5000, 5000, 0, 0)


def test_a_dry_run_checks_what_it_is_told_and_sends_nothing(kafka: KafkaNode) -> None:
    topic = new_topic(kafka.bootstrap, 1)
    reports = _write(kafka, topic, BASE + 4, _rows(range(500)))
    cluster = _cluster(kafka)
    try:
        found = cluster.describe_producers([(topic, 0)])[(topic, 0)]
        (mine,) = [p for p in found if p.producer_id == BASE + 4]
        batch = cluster.find_batch((topic, 0), BASE + 4, mine.last_sequence, mine.last_timestamp)
        assert batch is not None and batch.last_sequence == reports[0].last_sequence
        from pidctl.spark.kafka_records import FINGERPRINT_HEADER, Stamp

        stamp = Stamp.read(batch.records()[0].header(FINGERPRINT_HEADER))
        assert stamp is not None
        for rows, same in ((_rows(range(800)), True), (_rows(range(800), tag="x"), False)):
            dry = TaskProducer(cluster, BASE + 4, 0, 0, SMALL, resume=False, dry_run=True)
            dry.expect((topic, 0), mine.last_sequence, stamp.fingerprint)
            if same:
                dry.write(rows, topic)
            else:
                with pytest.raises(RowsDiffer):
                    dry.write(rows, topic)
    finally:
        cluster.close()
    assert count(kafka.bootstrap, topic, 500) == (500, 500, 0, 0)


def test_partitions_added_while_a_task_writes_stop_it(kafka: KafkaNode) -> None:
    topic = new_topic(kafka.bootstrap, 2)
    cluster = _cluster(kafka)
    try:
        producer = TaskProducer(cluster, BASE + 5, 0, 0, SMALL, resume=False)
        batches = _rows(range(4000))
        producer.add(next(batches), topic)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=60)

        def seen_by_the_cluster() -> bool:  # (the broker's metadata can lag the admin's answer)
            cluster.refresh([topic])
            return cluster.layout(topic).partitions == 4

        wait_until(seen_by_the_cluster, "the new partitions in the broker's metadata")
        with pytest.raises(RowsDiffer, match="has 4 partitions, not the 2"):
            for batch in batches:
                producer.add(batch, topic)
    finally:
        cluster.close()


def _slowly(rows: Iterator[pa.RecordBatch], pause_s: float) -> Iterator[pa.RecordBatch]:
    for batch in rows:
        time.sleep(pause_s)
        yield batch


@pytest.fixture
def restartable() -> Iterator[KafkaNode]:
    """A broker of its own, to kill and restart."""
    with KafkaNode() as node:
        yield node


@pytest.mark.slow
def test_a_broker_killed_and_restarted_mid_write_is_ridden_out(restartable: KafkaNode) -> None:
    """SIGKILL the only broker while a task writes, restart it 5 s later: the task's batches
    fail, its connections are refused, it asks again (backing off) within the delivery
    timeout, and once the broker is back finishes from the PID's LastSequence: every row
    once. With a delivery timeout shorter than the outage, it gives up, naming it."""
    topic = new_topic(restartable.bootstrap, 3)
    done: dict[str, object] = {}

    def run() -> None:
        try:
            done["reports"] = _write(
                restartable, topic, BASE + 6, _slowly(_rows(range(30_000), per=500), 0.05)
            )
        except BaseException as e:  # the assertion below says what
            done["error"] = e

    writer = threading.Thread(target=run)
    writer.start()
    deadline = time.monotonic() + 120
    while written_rows(restartable.bootstrap, topic) < 5000:
        assert time.monotonic() < deadline and writer.is_alive(), done
        time.sleep(0.1)
    restartable.kill()
    time.sleep(5)
    restartable.restart()
    writer.join(300)
    assert "error" not in done, done
    assert count(restartable.bootstrap, topic, 30_000) == (30_000, 30_000, 0, 0)
    # A shorter budget than the outage: a clear error.
    topic = new_topic(restartable.bootstrap, 1)
    short = replace(SMALL, delivery_timeout_s=2.0, request_timeout_s=1.0)
    failed: dict[str, BaseException] = {}

    def short_run() -> None:
        try:
            _write(
                restartable,
                topic,
                BASE + 7,
                _slowly(_rows(range(20_000), per=500), 0.05),
                settings=short,
            )
        except BaseException as e:
            failed["error"] = e

    writer = threading.Thread(target=short_run)
    writer.start()
    while written_rows(restartable.bootstrap, topic) < 2000:
        assert time.monotonic() < deadline + 300 and writer.is_alive(), failed
        time.sleep(0.1)
    restartable.kill()
    writer.join(120)
    restartable.restart()
    assert isinstance(failed.get("error"), KafkaWriteError)
    assert "delivery.timeout.ms" in str(failed["error"])


def test_a_task_started_while_the_broker_is_down_waits_for_it(restartable: KafkaNode) -> None:
    """A task whose first Metadata finds no broker asks again, backing off, within the
    delivery timeout, as its later questions do (it used to fail at once, and Spark ran it
    again and again while a broker restarted)."""
    topic = new_topic(restartable.bootstrap, 2)
    restartable.kill()

    def restart_soon() -> None:
        time.sleep(3)  # the outage the task starts in
        restartable.restart()

    restarter = threading.Thread(target=restart_soon)
    restarter.start()
    try:
        reports = _write(restartable, topic, BASE + 8, _rows(range(2000)))
    finally:
        restarter.join(120)
    assert sum(report.rows for report in reports) == 2000
    assert count(restartable.bootstrap, topic, 2000) == (2000, 2000, 0, 0)
