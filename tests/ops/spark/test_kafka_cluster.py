"""The Kafka cluster as pidctl-kafka sees it (ops/spark/kafka_cluster.py), against a real broker:
Produce's body encoded by hand is kio's; questions go on a connection of their own; a batch
is found back by its producer and last sequence; the brokers' settings and the cluster's own
producer ids are read from them."""

from __future__ import annotations

import io

import pyarrow as pa
from kio.schema.produce.v9 import ProduceRequest
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.serial import entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import new_topic
from pidctl.spark.kafka_cluster import KafkaCluster, produce_body, timeout_ms
from pidctl.spark.kafka_options import ProducerSettings
from pidctl.spark.kafka_producer import TaskProducer


def test_the_produce_body_is_kios() -> None:
    batch = [b"header-bytes", memoryview(b"records" * 100)]
    parts = produce_body("orders", 3, batch, acks=-1, timeout_ms=30_000)
    mine = b"".join(bytes(memoryview(part)) for part in parts)
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(timeout_ms(30.0)),
        topic_data=(
            TopicProduceData(
                name=TopicName("orders"),
                partition_data=(
                    PartitionProduceData(
                        index=i32(3), records=Records(b"header-bytes" + b"records" * 100)
                    ),
                ),
            ),
        ),
    )
    theirs = io.BytesIO()
    entity_writer(ProduceRequest)(theirs, request)
    assert mine == theirs.getvalue()


def test_a_batch_is_found_by_its_producer_and_last_sequence(kafka: KafkaNode) -> None:
    topic = new_topic(kafka.bootstrap, 1)
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    try:
        producer = TaskProducer(cluster, 2**62 + 99, 0, 0, ProducerSettings(4000), resume=False)
        rows = pa.RecordBatch.from_arrays([pa.array([f"{i}:x" for i in range(2000)])], ["value"])
        reports = producer.write(iter([rows]), topic)
        ((_, producers),) = cluster.describe_producers([(topic, 0)]).items()
        (mine,) = producers
        assert mine.last_sequence == reports[0].last_sequence == 1999
        found = cluster.find_batch((topic, 0), mine.producer_id, 1999, mine.last_timestamp)
        assert found is not None and found.last_sequence == 1999
        assert cluster.find_batch((topic, 0), mine.producer_id, 1998, mine.last_timestamp) is None
        assert sum(b.count for b in cluster.batches((topic, 0), 0)) == 2000
        assert cluster.end_offset((topic, 0)) == 2000 and cluster.start_offset((topic, 0)) == 0
    finally:
        cluster.close()


def test_the_brokers_settings_and_producer_ids_are_read_from_them(kafka: KafkaNode) -> None:
    cluster = KafkaCluster([kafka.bootstrap], client_id="t", timeout_s=30, connection={})
    try:
        value, who = cluster.broker_config("producer.id.expiration.ms")
        assert value == "86400000" and who.startswith("broker ")
        first = cluster.cluster_producer_id()
        assert 0 <= first < cluster.cluster_producer_id()  # the cluster's next, from 0 up
    finally:
        cluster.close()
