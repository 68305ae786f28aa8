"""Topics and a counting consumer on a real Kafka, for the pidctl-kafka tests and bench."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ops.testing.serverproc import wait_until

# What Kafka allows in a topic name (its Topic.validate).
_LEGAL = re.compile(r"[^A-Za-z0-9._-]")


def new_topic(bootstrap: str, partitions: int, prefix: str = "t") -> str:
    """Create a topic with a fresh name (replication 1) and return the name; characters a
    topic name may not hold (``+`` of a fault's name, say) become ``_`` in it."""
    name = f"{_LEGAL.sub('_', prefix)}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=60)[name]
    future.result(timeout=120)
    wait_until(lambda: _led(bootstrap, name), f"topic {name} led", timeout=120)
    return name


def _led(bootstrap: str, topic: str) -> bool:
    """Every partition has a leader that answers for it (a new topic's metadata spreads)."""
    try:
        written_rows(bootstrap, topic, strict=True)
    except KafkaException:
        return False
    return True


class Counted(NamedTuple):
    """Rows read back, by their unique key."""

    rows: int
    distinct: int
    duplicates: int
    missing: int


def read_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every value in the topic, read from offset 0 to each partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=60)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=60)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[bytes] = []
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < len(partitions):
            for message in consumer.consume(10_000, timeout=5):
                if message.error():
                    raise RuntimeError(str(message.error()))
                values.append(message.value() or b"")
                offset, partition = message.offset() or 0, message.partition() or 0
                if offset + 1 >= ends[partition]:
                    done.add(partition)
        return values
    finally:
        consumer.close()


def count(bootstrap: str, topic: str, expected: int) -> Counted:
    """Rows whose value is the decimal id 0..expected-1 (optionally ``id:...``), counted."""
    ids = Counter(int(v.split(b":", 1)[0]) for v in read_values(bootstrap, topic))
    missing = sum(1 for i in range(expected) if i not in ids)
    return Counted(sum(ids.values()), len(ids), sum(n - 1 for n in ids.values()), missing)


def written_rows(bootstrap: str, topic: str, *, strict: bool = False) -> int:
    """Rows in the topic so far: the sum of its partitions' high watermarks (0 while a
    leader does not answer, unless ``strict``)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        partitions = consumer.list_topics(topic, timeout=60).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1]
            for p in partitions
        )
    except KafkaException:
        if strict:
            raise
        return 0
    finally:
        consumer.close()
