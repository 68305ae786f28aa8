"""A Kafka cluster as ``pidctl-kafka`` sees it: bootstrap, Metadata (leaders), one connection
per broker, and DescribeProducers (each PID's epoch and LastSequence per partition).

Requests and responses are kio's entities over :class:`pidctl.client.SyncClient`, the same
client pidctl's own tools use; nothing here decides what to write.
"""

from __future__ import annotations

import datetime
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from pidctl.client import AuthenticationError, SyncClient
from pidctl.protocol import requests
from pidctl.protocol.apis import request_class

#: DescribeProducers' API key (Kafka's ApiKeys.DESCRIBE_PRODUCERS) and the version sent.
DESCRIBE_PRODUCERS = 61
#: Metadata version sent: topic names, leaders, no topic ids needed.
METADATA_VERSION = 12

TopicPartition = tuple[str, int]


class KafkaWriteError(RuntimeError):
    """The sink cannot write: the message names the option, topic or partition, and why."""


@dataclass(frozen=True, slots=True)
class ProducerState:
    """What a partition leader reports for one active producer (DescribeProducers v0)."""

    producer_id: int
    epoch: int
    last_sequence: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """A topic's partitions and each one's leader (broker id; -1 while there is none)."""

    name: str
    leaders: tuple[int, ...]

    @property
    def partitions(self) -> int:
        return len(self.leaders)


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
        self._clients: dict[int, SyncClient] = {}
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
        """A connection to the first bootstrap server that answers."""
        problems = []
        for address in self.bootstrap_servers:
            try:
                return self._connect(address)
            except OSError as e:
                problems.append(f"{address}: {e}")
        raise KafkaWriteError(
            "no Kafka broker of kafka.bootstrap.servers is reachable (" + "; ".join(problems) + ")"
        )

    def client(self, broker_id: int) -> SyncClient:
        """The connection to broker ``broker_id`` (opened on first use)."""
        client = self._clients.get(broker_id)
        if client is None:
            address = self._brokers.get(broker_id)
            if address is None:
                raise KafkaWriteError(f"broker {broker_id} is not in the cluster's metadata")
            try:
                client = self._clients[broker_id] = self._connect(address)
            except OSError as e:
                raise KafkaWriteError(f"Kafka broker {broker_id} at {address}: {e}") from e
        return client

    def drop(self, broker_id: int) -> None:
        """Close a broker's connection (after an error on it); the next use reopens it."""
        client = self._clients.pop(broker_id, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for broker_id in list(self._clients):
            self.drop(broker_id)

    # -- metadata ---------------------------------------------------------------------------

    def refresh(self, topics: Iterable[str]) -> None:
        """Metadata for ``topics``: brokers and leaders. A topic that does not exist raises
        :class:`KafkaWriteError` naming it (the sink never creates topics)."""
        names = sorted(set(topics))
        client = self._bootstrap_client()
        try:
            response = client.request(requests.metadata(names, version=METADATA_VERSION))
        except OSError as e:
            raise KafkaWriteError(f"Kafka Metadata request failed: {e}") from e
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

    # -- producer state ---------------------------------------------------------------------

    def describe_producers(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, asked of each partition's leader."""
        by_leader: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for partition in partitions:
            by_leader[self.leader(partition)][partition[0]].append(partition[1])
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
            try:
                response = self.client(leader).request(body)
            except OSError as e:
                self.drop(leader)
                raise KafkaWriteError(f"DescribeProducers on broker {leader} failed: {e}") from e
            for topic in response.topics:
                for answer in topic.partitions:
                    if answer.error_code:
                        where = f"{topic.name}-{answer.partition_index}"
                        why = f"{answer.error_code.name.upper()} {answer.error_message or ''}"
                        raise KafkaWriteError(f"DescribeProducers for {where}: {why.rstrip()}")
                    found[(topic.name, int(answer.partition_index))] = [
                        ProducerState(
                            int(state.producer_id),
                            int(state.producer_epoch),
                            int(state.last_sequence),
                            int(state.coordinator_epoch),
                            int(state.current_txn_start_offset),
                        )
                        for state in answer.active_producers
                    ]
        return found


def timeout_ms(seconds: float) -> datetime.timedelta:
    """A request's timeout field."""
    return datetime.timedelta(milliseconds=int(seconds * 1000))
