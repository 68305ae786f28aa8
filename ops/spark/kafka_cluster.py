"""A Kafka cluster as ``pidctl-kafka`` sees it: bootstrap, Metadata (leaders), and per broker
two connections — one that carries only Produce requests, and one for every other question
(DescribeProducers, ListOffsets, Fetch, DescribeConfigs, InitProducerId).

Why two: a producer keeps up to five Produce requests in flight on its connection, and a
broker answers a connection's requests in order; a question asked on that connection while
batches are in flight would be answered after them, and its caller would read a Produce
response as its answer. On a connection of its own, every question is answered at once.

Requests and responses are kio's entities over :class:`pidctl.client.SyncClient`, except
Produce, whose body (around record batches that go from their own buffers) is encoded here
(:func:`produce_body`, tested to be kio's bytes). Nothing here decides what to write.
"""

from __future__ import annotations

import datetime
import struct
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32, i64

from pidctl.client import AuthenticationError, SyncClient
from pidctl.protocol import requests
from pidctl.protocol.apis import request_class

#: API keys and the versions sent (Kafka's ApiKeys). Produce v9: topic names, flexible.
PRODUCE, PRODUCE_VERSION = 0, 9
FETCH, FETCH_VERSION = 1, 11
LIST_OFFSETS, LIST_OFFSETS_VERSION = 2, 7
METADATA_VERSION = 12
INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION = 22, 4
DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION = 32, 4
DESCRIBE_PRODUCERS = 61
#: DescribeConfigs' resource type of a broker (Kafka's ConfigResource.Type.BROKER).
BROKER_RESOURCE = 4
#: Bytes one Fetch asks for while looking for a batch (a few of the sink's batches).
FETCH_BYTES = 4 * 1024 * 1024
#: Most bytes read while looking for one batch: past it, the batch is taken for gone.
FIND_LIMIT_BYTES = 64 * 1024 * 1024

if TYPE_CHECKING:  # numpy and pyarrow only where batches are read back
    from pidctl.spark.kafka_records import BatchView

TopicPartition = tuple[str, int]


class KafkaWriteError(RuntimeError):
    """The sink cannot write: the message names the option, topic or partition, and why."""


class KafkaUnavailable(KafkaWriteError):
    """No broker (or not the one needed) answers now: worth asking again, within the
    write's time budget (``kafka.delivery.timeout.ms``)."""


@dataclass(frozen=True, slots=True)
class ProducerState:
    """What a partition leader reports for one active producer (DescribeProducers v0)."""

    producer_id: int
    epoch: int
    last_sequence: int
    coordinator_epoch: int
    current_txn_start_offset: int
    last_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """A topic's partitions and each one's leader (broker id; -1 while there is none)."""

    name: str
    leaders: tuple[int, ...]

    @property
    def partitions(self) -> int:
        return len(self.leaders)


def _compact_length(n: int) -> bytes:
    """An unsigned varint of ``n + 1`` (a compact array's or string's length)."""
    value, out = n + 1, bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def produce_body(
    topic: str, partition: int, batch: Sequence[Any], *, acks: int, timeout_ms: int
) -> list[Any]:
    """Produce v9's body for one record batch of one partition, in parts: the bytes before
    the batch, the batch's own parts (its header and records, not copied), the bytes after
    it. ``transactional_id`` null."""
    size = sum(memoryview(part).nbytes for part in batch)
    name = topic.encode()
    head = b"".join(
        [
            b"\x00",  # transactional_id: null
            struct.pack(">hi", acks, timeout_ms),
            _compact_length(1),  # one topic
            _compact_length(len(name)),
            name,
            _compact_length(1),  # one partition
            struct.pack(">i", partition),
            _compact_length(size),
        ]
    )
    # The partition's, the topic's and the request's tagged fields: none.
    return [head, *batch, b"\x00\x00\x00"]


class KafkaCluster:
    """Connections to one Kafka cluster, opened as needed and closed together."""

    def __init__(
        self,
        bootstrap_servers: Iterable[str],
        *,
        client_id: str,
        timeout_s: float,
        connection: dict[str, Any],
    ) -> None:
        """``connection``: ``ssl_context`` and/or ``sasl`` for :class:`SyncClient`."""
        self.bootstrap_servers = tuple(bootstrap_servers)
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.connection = connection
        self._brokers: dict[int, str] = {}
        self._producers: dict[int, SyncClient] = {}
        self._admins: dict[int, SyncClient] = {}
        self.topics: dict[str, TopicLayout] = {}

    # -- connections ------------------------------------------------------------------------

    def _connect(self, address: str) -> SyncClient:
        try:
            return SyncClient(
                address, client_id=self.client_id, timeout=self.timeout_s, **self.connection
            )
        except AuthenticationError as e:
            raise KafkaWriteError(f"Kafka broker {address} refused authentication: {e}") from e

    def _bootstrap_client(self) -> SyncClient:
        """A connection to the first bootstrap server (or known broker) that answers."""
        problems = []
        for address in (*self.bootstrap_servers, *self._brokers.values()):
            try:
                return self._connect(address)
            except OSError as e:
                problems.append(f"{address}: {e}")
        raise KafkaUnavailable(
            "no Kafka broker of kafka.bootstrap.servers is reachable (" + "; ".join(problems) + ")"
        )

    def _open(self, pool: dict[int, SyncClient], broker_id: int) -> SyncClient:
        client = pool.get(broker_id)
        if client is None:
            address = self._brokers.get(broker_id)
            if address is None:
                raise KafkaUnavailable(f"broker {broker_id} is not in the cluster's metadata")
            try:
                client = pool[broker_id] = self._connect(address)
            except OSError as e:
                raise KafkaUnavailable(f"Kafka broker {broker_id} at {address}: {e}") from e
        return client

    def producer(self, broker_id: int) -> SyncClient:
        """The connection that carries Produce requests to ``broker_id`` (and nothing else)."""
        return self._open(self._producers, broker_id)

    def admin(self, broker_id: int) -> SyncClient:
        """The connection for every other question to ``broker_id``: never one with
        Produce requests in flight."""
        return self._open(self._admins, broker_id)

    def drop(self, broker_id: int) -> None:
        """Close a broker's Produce connection (after an error on it); reopened on use."""
        client = self._producers.pop(broker_id, None)
        if client is not None:
            client.close()

    def _drop_admin(self, broker_id: int) -> None:
        client = self._admins.pop(broker_id, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for pool in (self._producers, self._admins):
            for client in pool.values():
                client.close()
            pool.clear()

    def _ask(self, broker_id: int, body: Any) -> Any:
        """``body`` asked of ``broker_id`` on its admin connection; a lost connection raises
        KafkaUnavailable (the connection is dropped, and reopened on the next question)."""
        try:
            return self.admin(broker_id).request(body)
        except OSError as e:
            self._drop_admin(broker_id)
            raise KafkaUnavailable(f"{type(body).__name__} to broker {broker_id}: {e}") from e

    # -- metadata ---------------------------------------------------------------------------

    def refresh(self, topics: Iterable[str]) -> None:
        """Metadata for ``topics``: brokers and leaders. A topic that does not exist raises
        :class:`KafkaWriteError` naming it (the sink never creates topics); no broker that
        answers, :class:`KafkaUnavailable`."""
        names = sorted(set(topics))
        client = self._bootstrap_client()
        try:
            response = client.request(requests.metadata(names, version=METADATA_VERSION))
        except OSError as e:
            raise KafkaUnavailable(f"Kafka Metadata request failed: {e}") from e
        finally:
            client.close()
        self._brokers.update(
            {int(broker.node_id): f"{broker.host}:{broker.port}" for broker in response.brokers}
        )
        for topic in response.topics:
            if topic.error_code == ErrorCode.unknown_topic_or_partition:
                raise KafkaWriteError(
                    f"topic {topic.name!r} does not exist (the sink does not create topics)"
                )
            if topic.error_code == ErrorCode.topic_authorization_failed:
                raise KafkaWriteError(f"not authorised to write to topic {topic.name!r}")
            if topic.error_code and topic.error_code != ErrorCode.leader_not_available:
                raise KafkaWriteError(f"topic {topic.name!r}: {topic.error_code.name.upper()}")
            leaders = [-1] * len(topic.partitions)
            for partition in topic.partitions:
                if 0 <= partition.partition_index < len(leaders):
                    leaders[partition.partition_index] = int(partition.leader_id)
            self.topics[topic.name] = TopicLayout(topic.name, tuple(leaders))

    def layout(self, topic: str) -> TopicLayout:
        """The topic's partitions and leaders (Metadata asked for on first use)."""
        if topic not in self.topics:
            self.refresh([topic])
        return self.topics[topic]

    def leader(self, partition: TopicPartition) -> int:
        """The partition's leader; raises KafkaWriteError for a partition out of range."""
        topic, index = partition
        layout = self.layout(topic)
        if not 0 <= index < layout.partitions:
            raise KafkaWriteError(
                f"partition {index} of topic {topic!r} is out of range: the topic has "
                f"{layout.partitions} partitions (column 'partition')"
            )
        return layout.leaders[index]

    def _answering_leader(self, partition: TopicPartition) -> int:
        leader = self.leader(partition)
        if leader < 0:
            raise KafkaUnavailable(f"{partition[0]}-{partition[1]} has no leader now")
        return leader

    # -- producer state ---------------------------------------------------------------------

    def describe_producers(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, asked of each partition's leader."""
        by_leader: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for partition in partitions:
            by_leader[self._answering_leader(partition)][partition[0]].append(partition[1])
        cls: Any = request_class(DESCRIBE_PRODUCERS, 0)
        entity = sys.modules[cls.__module__].TopicRequest
        found: dict[TopicPartition, list[ProducerState]] = {}
        for leader, topics in by_leader.items():
            body = cls(
                topics=tuple(
                    entity(name=name, partition_indexes=tuple(i32(p) for p in indexes))
                    for name, indexes in sorted(topics.items())
                )
            )
            response = self._ask(leader, body)
            for topic in response.topics:
                for answer in topic.partitions:
                    where = f"{topic.name}-{answer.partition_index}"
                    if answer.error_code in _MOVED:
                        raise KafkaUnavailable(f"DescribeProducers for {where}: leader moved")
                    if answer.error_code:
                        why = f"{answer.error_code.name.upper()} {answer.error_message or ''}"
                        raise KafkaWriteError(f"DescribeProducers for {where}: {why.rstrip()}")
                    found[(topic.name, int(answer.partition_index))] = [
                        ProducerState(
                            int(state.producer_id),
                            int(state.producer_epoch),
                            int(state.last_sequence),
                            int(state.coordinator_epoch),
                            int(state.current_txn_start_offset),
                            int(state.last_timestamp),
                        )
                        for state in answer.active_producers
                    ]
        return found

    # -- reading back -----------------------------------------------------------------------

    def offset_for_time(self, partition: TopicPartition, timestamp_ms: int) -> int:
        """The first offset of ``partition`` whose timestamp is at least ``timestamp_ms``
        (ListOffsets by time), -1 if none is."""
        return self._list_offset(partition, timestamp_ms)

    def end_offset(self, partition: TopicPartition) -> int:
        """The partition's log end offset (ListOffsets, latest)."""
        return self._list_offset(partition, -1)

    def start_offset(self, partition: TopicPartition) -> int:
        """The partition's log start offset (ListOffsets, earliest)."""
        return self._list_offset(partition, -2)

    def _list_offset(self, partition: TopicPartition, timestamp: int) -> int:
        cls: Any = request_class(LIST_OFFSETS, LIST_OFFSETS_VERSION)
        module = sys.modules[cls.__module__]
        topic, index = partition
        body = cls(
            replica_id=i32(-1),
            isolation_level=i8(0),
            topics=(
                module.ListOffsetsTopic(
                    name=topic,
                    partitions=(
                        module.ListOffsetsPartition(
                            partition_index=i32(index),
                            current_leader_epoch=i32(-1),
                            timestamp=i64(timestamp),
                        ),
                    ),
                ),
            ),
        )
        response = self._ask(self._answering_leader(partition), body)
        answer = response.topics[0].partitions[0]
        if answer.error_code in _MOVED:
            raise KafkaUnavailable(f"ListOffsets for {topic}-{index}: leader moved")
        if answer.error_code:
            raise KafkaWriteError(f"ListOffsets for {topic}-{index}: {answer.error_code.name}")
        return int(answer.offset)

    def fetch(self, partition: TopicPartition, offset: int, max_bytes: int = FETCH_BYTES) -> bytes:
        """The record batches of ``partition`` from ``offset`` on, about ``max_bytes`` of
        them (read_uncommitted; at least one whole batch whatever its size)."""
        cls: Any = request_class(FETCH, FETCH_VERSION)
        module = sys.modules[cls.__module__]
        topic, index = partition
        body = cls(
            replica_id=i32(-1),
            max_wait=datetime.timedelta(0),
            min_bytes=i32(0),
            max_bytes=i32(max_bytes),
            isolation_level=i8(0),
            session_id=i32(0),
            session_epoch=i32(-1),
            topics=(
                module.FetchTopic(
                    topic=topic,
                    partitions=(
                        module.FetchPartition(
                            partition=i32(index),
                            current_leader_epoch=i32(-1),
                            fetch_offset=i64(offset),
                            log_start_offset=i64(-1),
                            partition_max_bytes=i32(max_bytes),
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        response = self._ask(self._answering_leader(partition), body)
        if response.error_code:
            raise KafkaWriteError(f"Fetch from {topic}-{index}: {response.error_code.name}")
        answer = response.responses[0].partitions[0]
        if answer.error_code in _MOVED:
            raise KafkaUnavailable(f"Fetch from {topic}-{index}: leader moved")
        if answer.error_code:
            raise KafkaWriteError(f"Fetch from {topic}-{index}: {answer.error_code.name}")
        return bytes(answer.records or b"")

    def batches(
        self, partition: TopicPartition, start: int, end: int | None = None
    ) -> Iterator[BatchView]:
        """The record batches of ``partition`` from offset ``start`` to ``end`` (default: its
        end now), read a few megabytes at a time."""
        from pidctl.spark.kafka_records import read_batches

        stop = self.end_offset(partition) if end is None else end
        offset = start
        while offset < stop:
            data = self.fetch(partition, offset)
            last = offset
            for batch in read_batches(data):
                if batch.last_offset < offset:
                    continue
                yield batch
                last = batch.last_offset + 1
            if last == offset:  # nothing whole came back: the partition ends before ``stop``
                return
            offset = last

    def find_batch(
        self, partition: TopicPartition, producer_id: int, last_sequence: int, timestamp_ms: int
    ) -> BatchView | None:
        """The batch ``producer_id`` wrote to ``partition`` that ends at ``last_sequence``
        (DescribeProducers' LastSequence, with its LastTimestamp, the batch's latest
        timestamp): read from the first offset with that timestamp on (ListOffsets), at most
        :data:`FIND_LIMIT_BYTES`; None if it is not there (removed by retention, say)."""
        start = self.offset_for_time(partition, timestamp_ms)
        if start < 0:
            return None
        read = 0
        for batch in self.batches(partition, start):
            if batch.producer_id == producer_id and batch.last_sequence == last_sequence:
                return batch
            read += batch.size
            if read > FIND_LIMIT_BYTES:
                return None
        return None

    # -- the cluster's settings and producer ids ---------------------------------------------

    def broker_config(self, name: str) -> tuple[str | None, str]:
        """A broker's value of config ``name`` (DescribeConfigs on one broker of the
        cluster), and who said it: (None, why) when the broker does not tell."""
        client = self._bootstrap_client()
        try:
            metadata = client.request(requests.metadata([], version=METADATA_VERSION))
            if not metadata.brokers:
                return None, "the cluster's metadata lists no broker"
            broker = str(int(metadata.brokers[0].node_id))
            cls: Any = request_class(DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION)
            module = sys.modules[cls.__module__]
            body = cls(
                resources=(
                    module.DescribeConfigsResource(
                        resource_type=i8(BROKER_RESOURCE),
                        resource_name=broker,
                        configuration_keys=(name,),
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
            response = client.request(body)
        except OSError as e:
            raise KafkaUnavailable(f"DescribeConfigs failed: {e}") from e
        finally:
            client.close()
        result = response.results[0]
        if result.error_code:
            return None, f"broker {broker} refused DescribeConfigs: {result.error_code.name}"
        for config in result.configs:
            if config.name == name and config.value is not None:
                return str(config.value), f"broker {broker}"
        return None, f"broker {broker} did not report {name}"

    def cluster_producer_id(self) -> int:
        """A producer id from the cluster's own allocator now (an idempotent InitProducerId
        to a broker): the cluster hands out ids above it from here on."""
        cls: Any = request_class(INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION)
        body = cls(
            transactional_id=None,
            transaction_timeout=datetime.timedelta(milliseconds=-1),
            producer_id=i64(-1),
            producer_epoch=i16(-1),
        )
        client = self._bootstrap_client()
        try:
            for attempt in range(INIT_ATTEMPTS):
                if attempt:
                    time.sleep(INIT_BACKOFF_S)
                answer = client.request(body)
                if answer.error_code == ErrorCode.none:
                    return int(answer.producer_id)
                if answer.error_code not in _INIT_RETRIABLE:
                    raise KafkaWriteError(
                        f"the cluster refused an idempotent InitProducerId: "
                        f"{answer.error_code.name.upper()}"
                    )
        except OSError as e:
            raise KafkaUnavailable(f"InitProducerId failed: {e}") from e
        finally:
            client.close()
        raise KafkaUnavailable("the cluster kept answering InitProducerId with a retriable error")


#: Errors after which a question goes to the partition's new leader.
_MOVED = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
    }
)
#: An idempotent InitProducerId while the broker fetches a block of ids: asked again.
_INIT_RETRIABLE = frozenset(
    {
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.concurrent_transactions,
    }
)
INIT_ATTEMPTS = 20
INIT_BACKOFF_S = 0.1


def timeout_ms(seconds: float) -> datetime.timedelta:
    """A request's timeout field."""
    return datetime.timedelta(milliseconds=int(seconds * 1000))
