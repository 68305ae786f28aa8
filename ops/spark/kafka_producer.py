"""One Spark task's producer: its rows into Kafka with the task's preallocated PID, each row with
the same (PID, epoch, sequence) on every attempt, so that the brokers drop what an earlier
attempt wrote.

Per Kafka partition the rows get sequences 0, 1, 2, ... in the order they come. Record
batches are built by aiokafka's ``DefaultRecordBatchBuilder`` (kafka-python's builder,
compiled with Cython: 5-6 times faster, the same batches) with the given PID, epoch and base
sequence, and sent with acks=all in Produce requests (kio entities), at most
:data:`MAX_IN_FLIGHT` per broker connection — no more than the 5 batches a broker remembers
per (PID, partition), so an exact re-send is always recognised.

Before writing a partition an attempt that may follow another one (``resume=True``: a retry, a
speculative copy, a re-run) asks the leader for its PID's LastSequence (DescribeProducers)
and skips the rows up to it. Any error on a batch is resolved the same way: the partition's
batches in flight are drained, LastSequence asked again, and the rows after it sent anew;
a retriable error (leader moved, timeout, broker unreachable) refreshes the metadata first,
at most ``retries`` times per partition with ``retry_backoff_s`` between.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.partitioner.default import murmur2
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import ProduceRequest
from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta

from pidctl.spark.kafka_cluster import (
    KafkaCluster,
    KafkaWriteError,
    TopicPartition,
    timeout_ms,
)
from pidctl.spark.murmur2 import key_partitions

#: Produce requests in flight per broker connection: the batches a broker keeps per (PID,
#: partition) for recognising re-sends (Kafka's max.in.flight.requests.per.connection limit
#: with idempotence).
MAX_IN_FLIGHT = 5
#: acks=all.
ACKS_ALL = -1
#: Record batch format v2 (magic 2), the one that carries PID, epoch and sequence.
MAGIC = 2
#: Kafka's sequences are int32: a (PID, partition) can carry this many rows.
SEQUENCE_LIMIT = 2**31 - 1
#: Rows without key or partition go to one partition this many at a time, then the next
#: (a deterministic "sticky" choice: every attempt puts each row in the same place).
STICKY_ROWS = 1000
#: Errors after which the batch's partition is resolved by its LastSequence and sent again.
RETRIABLE = frozenset(
    {
        ErrorCode.out_of_order_sequence_number,
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.request_timed_out,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.network_exception,
        ErrorCode.kafka_storage_error,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.throttling_quota_exceeded,
    }
)
#: Rows between two readings of the clock for the records' timestamps.
STAMP_EVERY = 1024
#: ``compression.type`` as a record batch's attributes say it (Kafka's CompressionType ids).
COMPRESSION = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

Row = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """How a task produces (from the sink's options)."""

    batch_bytes: int = 1_000_000
    buffer_bytes: int = 32 * 1024 * 1024
    compression: int = COMPRESSION["none"]
    request_timeout_s: float = 30.0
    retries: int = 10
    retry_backoff_s: float = 0.1


@dataclass(slots=True)
class _Batch:
    partition: TopicPartition
    first_sequence: int
    rows: list[Row]
    leader: int = -1


@dataclass(slots=True)
class _PartitionState:
    """One Kafka partition as this task writes it."""

    #: The sequence the next row gets.
    next_sequence: int = 0
    #: Rows up to this sequence are in the partition (written by an earlier attempt, or
    #: acknowledged): a row at or below it is skipped.
    written_through: int = -1
    builder: Any = None
    first_sequence: int = 0
    rows: list[Row] = field(default_factory=list)
    size: int = 0
    in_flight: int = 0
    failed: list[_Batch] = field(default_factory=list)
    retries: int = 0
    sent_rows: int = 0
    skipped_rows: int = 0


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What a task wrote to one Kafka partition."""

    topic: str
    partition: int
    rows: int
    written: int
    skipped: int
    last_sequence: int


class TaskProducer:
    """Writes one Spark partition's rows with one PID; :meth:`close` waits for every ack."""

    def __init__(
        self,
        cluster: KafkaCluster,
        producer_id: int,
        epoch: int,
        spark_partition: int,
        settings: ProducerSettings,
        *,
        resume: bool,
    ) -> None:
        self.cluster = cluster
        self.producer_id = producer_id
        self.epoch = epoch
        self.spark_partition = spark_partition
        self.settings = settings
        self.resume = resume
        self.partitions: dict[TopicPartition, _PartitionState] = {}
        self._described: set[str] = set()
        self._sticky: dict[str, int] = {}
        self._in_flight: dict[int, deque[_Batch]] = {}
        self._open_bytes = 0
        #: The records' timestamp (CreateTime, ms), refreshed every STAMP_EVERY rows.
        self._stamp = int(time.time() * 1000)

    # -- rows in ----------------------------------------------------------------------------

    def key_partitions(self, topic: str, keys: Any) -> list[int | None]:
        """Kafka's default partitioner over an Arrow column of keys at once (None for a null
        key: :meth:`choose_partition` places it)."""
        return key_partitions(keys, self.cluster.layout(topic).partitions)

    def choose_partition(self, topic: str, key: bytes | None) -> int:
        """Kafka's default partitioner for a keyed row (murmur2 of the key, as the Java
        client); rows without a key STICKY_ROWS at a time per partition, starting at the
        Spark partition's index, the same on every attempt."""
        count = self.cluster.layout(topic).partitions
        if key is not None:
            return int(murmur2(key) & 0x7FFFFFFF) % count
        seen = self._sticky.get(topic, 0)
        self._sticky[topic] = seen + 1
        return (self.spark_partition + seen // STICKY_ROWS) % count

    def send(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
    ) -> None:
        """Add one row (partition None: chosen by :meth:`choose_partition`)."""
        if partition is None:
            partition = self.choose_partition(topic, key)
        tp = (topic, partition)
        state = self.partitions.get(tp)
        if state is None:
            state = self._start(tp)
        sequence = state.next_sequence
        if sequence >= SEQUENCE_LIMIT:
            raise KafkaWriteError(
                f"{topic}-{partition}: more than {SEQUENCE_LIMIT} rows from one Spark partition"
            )
        state.next_sequence = sequence + 1
        if sequence <= state.written_through:
            state.skipped_rows += 1
            return
        self._append(tp, state, (key, value, headers))

    def _start(self, tp: TopicPartition) -> _PartitionState:
        self.cluster.leader(tp)  # the topic exists and the partition is in range
        if self.resume and tp[0] not in self._described:
            self._describe(tp[0])
        return self.partitions.setdefault(tp, _PartitionState())

    def _describe(self, topic: str) -> None:
        """LastSequence of this PID on every partition of ``topic`` (one DescribeProducers per
        leader): an earlier attempt's rows up to it are skipped."""
        layout = self.cluster.layout(topic)
        found = self.cluster.describe_producers((topic, p) for p in range(layout.partitions))
        for tp, producers in found.items():
            last = self._last_sequence(tp, producers)
            state = self.partitions.setdefault(tp, _PartitionState())
            state.written_through = max(state.written_through, last)
        self._described.add(topic)

    def _last_sequence(self, tp: TopicPartition, producers: list[Any]) -> int:
        for producer in producers:
            if producer.producer_id != self.producer_id:
                continue
            if producer.epoch != self.epoch or producer.current_txn_start_offset != -1:
                raise KafkaWriteError(
                    f"{tp[0]}-{tp[1]}: producer id {self.producer_id} is in use by another "
                    f"producer (epoch {producer.epoch}"
                    f"{', in a transaction' if producer.current_txn_start_offset != -1 else ''})"
                    ": the job's PID range collides with the cluster's (docs/spark-kafka.md)"
                )
            return int(producer.last_sequence)
        return -1

    def _append(self, tp: TopicPartition, state: _PartitionState, row: Row) -> None:
        key, value, headers = row
        if state.builder is None:
            state.builder = self._builder(state.next_sequence - 1)
            state.first_sequence = state.next_sequence - 1
        stamp = self._stamp
        added = state.builder.append(len(state.rows), stamp, key, value, headers)
        if added is None:  # the batch is full
            self._ship(tp, state)
            state.builder = self._builder(state.next_sequence - 1)
            state.first_sequence = state.next_sequence - 1
            added = state.builder.append(0, stamp, key, value, headers)
            if added is None:
                raise KafkaWriteError(
                    f"{tp[0]}-{tp[1]}: a row of "
                    f"{len(key or b'') + len(value or b'')} bytes does not fit a batch"
                )
        state.rows.append(row)
        state.size += added.size
        self._open_bytes += added.size
        if self._open_bytes > self.settings.buffer_bytes:
            for open_tp, open_state in self.partitions.items():
                if open_state.rows:
                    self._ship(open_tp, open_state)

    def _builder(self, first_sequence: int) -> Any:
        return DefaultRecordBatchBuilder(
            MAGIC,
            self.settings.compression,
            False,
            self.producer_id,
            self.epoch,
            first_sequence,
            self.settings.batch_bytes,
        )

    # -- batches out ------------------------------------------------------------------------

    def _ship(self, tp: TopicPartition, state: _PartitionState) -> None:
        """Send the partition's open batch (after resolving its failed ones, if any)."""
        batch, builder = _Batch(tp, state.first_sequence, state.rows), state.builder
        self._open_bytes -= state.size
        state.builder, state.rows, state.size = None, [], 0
        if state.failed:
            self._settle(tp, state)
        if batch.first_sequence > state.written_through:
            self._send_batch(batch, bytes(builder.build()))
        else:  # an attempt running beside this one wrote some of it meanwhile
            self._send_rest(state, batch)

    def _send_rest(self, state: _PartitionState, batch: _Batch) -> None:
        """Send the rows of ``batch`` after the partition's LastSequence, if any."""
        first = max(batch.first_sequence, state.written_through + 1)
        kept = batch.rows[first - batch.first_sequence :]
        state.skipped_rows += len(batch.rows) - len(kept)
        if kept:
            again = _Batch(batch.partition, first, kept)
            self._send_batch(again, self._encode(again))

    def _settle(self, tp: TopicPartition, state: _PartitionState) -> None:
        """Wait for the partition's batches in flight, then resolve its failed ones."""
        while state.in_flight:
            leader = next(
                leader
                for leader, queue in self._in_flight.items()
                if any(b.partition == tp for b in queue)
            )
            self._receive(leader)
        while state.failed and not state.in_flight:
            self._resolve(tp, state)

    def _encode(self, batch: _Batch) -> bytes:
        builder = self._builder(batch.first_sequence)
        stamp = int(time.time() * 1000)
        for offset, (key, value, headers) in enumerate(batch.rows):
            builder.append(offset, stamp, key, value, headers)
        return bytes(builder.build())

    def _send_batch(self, batch: _Batch, records: bytes) -> None:
        leader = self.cluster.leader(batch.partition)
        if leader < 0:
            self._failed(batch, ErrorCode.leader_not_available)
            return
        while len(self._in_flight.setdefault(leader, deque())) >= MAX_IN_FLIGHT:
            self._receive(leader)
        queue = self._in_flight.setdefault(leader, deque())  # a lost connection replaced it
        topic, index = batch.partition
        request = ProduceRequest(
            transactional_id=None,
            acks=i16(ACKS_ALL),
            timeout=i32Timedelta.parse(timeout_ms(self.settings.request_timeout_s)),
            topic_data=(
                TopicProduceData(
                    name=TopicName(topic),
                    partition_data=(
                        PartitionProduceData(index=i32(index), records=Records(records)),
                    ),
                ),
            ),
        )
        batch.leader = leader
        try:
            self.cluster.client(leader).send(request)
        except OSError:
            self._connection_lost(leader)
            self._failed(batch, ErrorCode.network_exception)
            return
        queue.append(batch)
        self.partitions[batch.partition].in_flight += 1

    def _receive(self, leader: int) -> None:
        """The answer to the oldest batch in flight to ``leader``."""
        queue = self._in_flight[leader]
        try:
            response = self.cluster.client(leader).receive()
        except OSError:
            self._connection_lost(leader)
            return
        batch = queue.popleft()
        self.partitions[batch.partition].in_flight -= 1
        answer = response.responses[0].partition_responses[0]
        if answer.error_code:
            self._failed(batch, answer.error_code, answer.error_message)
            return
        state = self.partitions[batch.partition]
        state.sent_rows += len(batch.rows)
        state.written_through = max(
            state.written_through, batch.first_sequence + len(batch.rows) - 1
        )

    def _connection_lost(self, leader: int) -> None:
        """Every batch in flight to ``leader`` failed: resolved by LastSequence later."""
        self.cluster.drop(leader)
        for batch in self._in_flight.pop(leader, deque()):
            self.partitions[batch.partition].in_flight -= 1
            self._failed(batch, ErrorCode.network_exception)

    def _failed(self, batch: _Batch, error: ErrorCode, message: str | None = None) -> None:
        tp = batch.partition
        if error not in RETRIABLE:
            detail = f" ({message})" if message else ""
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: Kafka refused a batch of producer {self.producer_id}: "
                f"{error.name.upper()}{detail}"
            )
        self.partitions[tp].failed.append(batch)

    def _resolve(self, tp: TopicPartition, state: _PartitionState) -> None:
        """Every failed batch of ``tp`` is sent again from the PID's LastSequence on, once
        none of the partition's batches is in flight any more."""
        state.retries += 1
        if state.retries > self.settings.retries:
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: gave up after {self.settings.retries} retries "
                f"(producer {self.producer_id})"
            )
        time.sleep(self.settings.retry_backoff_s)
        self.cluster.refresh([tp[0]])
        (producers,) = self.cluster.describe_producers([tp]).values()
        last = self._last_sequence(tp, producers)
        state.written_through = max(state.written_through, last)
        failed, state.failed = sorted(state.failed, key=lambda b: b.first_sequence), []
        for batch in failed:
            self._send_rest(state, batch)

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> list[PartitionReport]:
        """Send what is open, wait for every answer (resolving failures), and report."""
        for tp, state in self.partitions.items():
            if state.rows:
                self._ship(tp, state)
        while True:
            for leader, queue in list(self._in_flight.items()):
                while queue:
                    self._receive(leader)
            pending = [(tp, s) for tp, s in self.partitions.items() if s.failed]
            if not pending and not any(self._in_flight.values()):
                break
            for tp, state in pending:
                self._settle(tp, state)
        return [
            PartitionReport(
                tp[0],
                tp[1],
                state.next_sequence,
                state.sent_rows,
                state.skipped_rows,
                state.next_sequence - 1,
            )
            for tp, state in sorted(self.partitions.items())
        ]

    def write(self, rows: Iterable[tuple[str, int | None, Row]]) -> list[PartitionReport]:
        """Send every (topic, partition, (key, value, headers)) row, then :meth:`close`."""
        send, since_stamp = self.send, 0
        for topic, partition, (key, value, headers) in rows:
            since_stamp += 1
            if since_stamp == STAMP_EVERY:  # the clock read once per so many rows
                self._stamp, since_stamp = int(time.time() * 1000), 0
            send(topic, partition, key, value, headers)
        return self.close()
