"""One Spark task's producer: its rows into Kafka with the task's preallocated PID, each row with
the same (PID, epoch, sequence) on every attempt, so that the brokers drop what an earlier
attempt wrote — and a check that what an earlier attempt wrote is what this one has.

Rows come as Arrow record batches and are handled a column at a time: the Kafka partition of
every row (Kafka's default partitioner over the key column, or the ``partition`` column),
the rows of each partition taken together, their canonical bytes and records encoded by
:mod:`pidctl.spark.kafka_records`. Per Kafka partition the rows get sequences 0, 1, 2, ... in
the order they come, and go out in record batches of about ``batch_bytes``, each sent with
acks=all in its own Produce request, at most :data:`MAX_IN_FLIGHT` per broker connection —
the 5 batches a broker remembers per (PID, partition), so an exact re-send is recognised.

**Resuming.** An attempt that may follow another one (``resume=True``: a retry, a speculative
copy, a re-run of a version that wrote rows) asks each leader for its PID's LastSequence
(DescribeProducers) before it writes a partition, and skips the rows up to it. It also reads
the fingerprint the last batch of those carries (``kafka_records``) and checks its own rows
against it when they reach that sequence; until every such check has passed it sends nothing
(up to :data:`HOLD_LIMIT_BYTES` of rows wait), so a run whose rows differ from what was
written — other data, a non-deterministic input, another partitioning, more topic
partitions — stops before it writes a row (:class:`RowsDiffer`).

**Failures.** Any error on a batch is resolved the same way: the partition's batches in flight
are drained, its leader looked up again and its LastSequence asked (on the broker's other
connection, never one with Produce requests in flight), and the rows after it sent anew.
Retries go on, backing off from ``retry_backoff_s`` to ``retry_backoff_max_s``, until the
partition has been failing for ``delivery_timeout_s`` (Kafka's ``delivery.timeout.ms``,
120 s by default, as the Java client's) — long enough to ride out a broker's restart.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from kio.schema.errors import ErrorCode

from pidctl.spark.kafka_cluster import (
    PRODUCE,
    PRODUCE_VERSION,
    KafkaCluster,
    KafkaUnavailable,
    KafkaWriteError,
    ProducerState,
    TopicPartition,
    produce_body,
)
from pidctl.spark.kafka_options import ProducerSettings
from pidctl.spark.kafka_records import (
    BATCH_HEADER,
    FINGERPRINT_HEADER,
    Canonical,
    Stamp,
    batch,
    canonical,
    first_record,
    header_bytes,
    record,
    records,
)
from pidctl.spark.murmur2 import partitions_of

#: Produce requests in flight per broker connection: the batches a broker keeps per (PID,
#: partition) for recognising re-sends (Kafka's max.in.flight.requests.per.connection limit
#: with idempotence).
MAX_IN_FLIGHT = 5
#: acks=all.
ACKS_ALL = -1
#: Kafka's sequences are int32: a (PID, partition) can carry this many rows.
SEQUENCE_LIMIT = 2**31 - 1
#: Rows without key or partition go to one partition this many at a time, then the next
#: (a deterministic "sticky" choice: every attempt puts each row in the same place).
STICKY_ROWS = 1000
#: Bytes a record may take beyond its canonical bytes (length, attributes, deltas), and
#: what a batch keeps free for the sink's header on its first record.
RECORD_OVERHEAD = 12
STAMP_ROOM = 96
#: Most bytes of rows held back while a resumed attempt checks what was written: an attempt
#: writes each partition's rows as they come, so what an earlier one wrote ends within its
#: buffers of the same point of the input; further than this, the rows are not the same.
HOLD_LIMIT_BYTES = 64 * 1024 * 1024
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
        ErrorCode.unknown_leader_epoch,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.throttling_quota_exceeded,
        ErrorCode.corrupt_message,
    }
)


class RowsDiffer(KafkaWriteError):
    """This attempt's rows are not the ones its PID already wrote: nothing of them is sent."""


@dataclass(slots=True)
class _Batch:
    """A batch of one partition's rows, sequences ``first`` on, with the fingerprints before
    and after them."""

    partition: TopicPartition
    first: int
    rows: Canonical
    fingerprint_before: int
    fingerprint_after: int

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1

    def fingerprint_at(self, sequence: int) -> int:
        """The fingerprint through ``sequence`` (one of this batch's)."""
        return self.rows.slice(0, sequence - self.first + 1).fingerprint(self.fingerprint_before)


@dataclass(slots=True)
class _Expected:
    """What the PID wrote through ``sequence``, by its fingerprint: this attempt's rows must
    be the same when they get there."""

    sequence: int
    fingerprint: int
    #: Checked before the attempt sends anything (found when it started).
    initial: bool


@dataclass(slots=True)
class _PartitionState:
    """One Kafka partition as this task writes it."""

    #: The sequence the next row gets.
    next_sequence: int = 0
    #: Rows up to this sequence are in the partition (written by an earlier attempt, or
    #: acknowledged): a row at or below it is skipped.
    written_through: int = -1
    #: The fingerprint through ``next_sequence - 1``.
    fingerprint: int = 0
    expected: _Expected | None = None
    open_chunks: list[pa.Array] = field(default_factory=list)
    open_rows: int = 0
    open_bytes: int = 0
    open_first: int = 0
    open_fingerprint: int = 0
    in_flight: int = 0
    failed: list[_Batch] = field(default_factory=list)
    failing_since: float | None = None
    attempts: int = 0
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
        started_ms: int | None = None,
        partitions: dict[str, int] | None = None,
        expiration_ms: int | None = None,
        name: tuple[str, int] | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``started_ms``: when the job version's first run started (stamped on every
        batch; default now). ``partitions``: each topic's partition count as the driver
        saw it (a topic not in it: as this task first sees it); a topic whose count changes
        while the job runs stops the task, since keyed rows would go elsewhere.
        ``expiration_ms``: the brokers' ``producer.id.expiration.ms``: an attempt that finds
        rows of its PID written by a run that started that long ago stops, since the
        brokers may have forgotten some of them. ``name``: the job version's (app id,
        version), stamped on every batch (a verifier finds the version's rows by it).
        ``dry_run``: check the rows against what :meth:`expect` says was written, and send
        nothing (a driver's check before a re-run writes anything)."""
        self.cluster = cluster
        self.producer_id = producer_id
        self.epoch = epoch
        self.spark_partition = spark_partition
        self.settings = settings
        self.resume = resume
        self.started_ms = int(time.time() * 1000) if started_ms is None else started_ms
        self.clock = clock
        self.topic_partitions = dict(partitions or {})
        self.expiration_ms = expiration_ms
        self.name = name
        self.dry_run = dry_run
        self.partitions: dict[TopicPartition, _PartitionState] = {}
        self._described: set[str] = set()
        self._sticky: dict[str, int] = {}
        self._in_flight: dict[int, deque[_Batch]] = {}
        self._open_bytes = 0
        #: Batches held back while initial checks are pending, and their bytes.
        self._held: list[_Batch] = []
        self._held_bytes = 0
        self._pending_checks = 0
        #: The records' timestamp (CreateTime, ms) of the batches built now.
        self._stamp_ms = int(time.time() * 1000)

    # -- rows in ----------------------------------------------------------------------------

    def write(self, batches: Iterable[pa.RecordBatch], topic: str | None) -> list[PartitionReport]:
        """Send every row of ``batches`` (columns ``value``, and ``key``, ``headers``,
        ``topic``, ``partition`` as in Spark's Kafka sink; ``topic``, when given, for every
        row), then :meth:`close`."""
        for rows in batches:
            if rows.num_rows:
                self.add(rows, topic)
        return self.close()

    def add(self, rows: pa.RecordBatch, topic: str | None) -> None:
        """Add one Arrow record batch of rows."""
        names = {name.lower(): i for i, name in enumerate(rows.schema.names)}
        self._stamp_ms = int(time.time() * 1000)
        key = rows.column(names["key"]) if "key" in names else None
        headers = None
        if "headers" in names:
            headers = [
                header_bytes([(h["key"], h["value"]) for h in row or ()])
                for row in rows.column(names["headers"]).to_pylist()
            ]
        rows_bytes = canonical(key, rows.column(names["value"]), headers)
        partition = rows.column(names["partition"]) if "partition" in names else None
        if topic is not None:
            self._add_topic(topic, rows_bytes, key, partition, None)
            return
        topics = rows.column(names["topic"])
        if topics.null_count:
            raise KafkaWriteError("a row's 'topic' is null and no topic option is set")
        encoded = topics.dictionary_encode()
        indices = np.asarray(encoded.indices, dtype=np.int64)
        for code, name in enumerate(encoded.dictionary.to_pylist()):
            where = np.flatnonzero(indices == code)
            self._add_topic(str(name), rows_bytes, key, partition, where)

    def _add_topic(
        self,
        topic: str,
        rows: Canonical,
        key: pa.Array | None,
        partition: pa.Array | None,
        where: np.ndarray | None,
    ) -> None:
        """The rows at ``where`` (all: None) go to ``topic``: each to its partition."""
        if where is not None:
            taken = pa.array(where)
            rows = Canonical(rows.rows.take(taken))
            key = None if key is None else key.take(taken)
            partition = None if partition is None else partition.take(taken)
        placed = self._place(topic, key, partition, len(rows))
        first = int(placed[0])
        if (placed == first).all():
            self._add((topic, first), rows)
            return
        order = np.argsort(placed, kind="stable")
        ordered = placed[order]
        bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(ordered)]
        for start, end in itertools.pairwise(bounds):
            chunk = rows.rows.take(pa.array(order[start:end]))
            self._add((topic, int(ordered[start])), Canonical(chunk))

    def _place(
        self, topic: str, key: pa.Array | None, partition: pa.Array | None, count: int
    ) -> np.ndarray:
        """Each row's partition: the ``partition`` column's, else Kafka's default
        partitioner: murmur2 of the key; rows without a key :data:`STICKY_ROWS` at a time per
        partition, starting at the Spark partition's index, the same on every attempt."""
        partitions = self.partition_count(topic)
        placed = np.full(count, -1, dtype=np.int64)
        if partition is not None:
            placed = np.asarray(partition.fill_null(-1), dtype=np.int64)
            bad = (placed >= partitions) | (placed < -1)
            if bad.any():
                raise KafkaWriteError(
                    f"partition {int(placed[np.flatnonzero(bad)[0]])} of topic {topic!r} is out "
                    f"of range: the topic has {partitions} partitions (column 'partition')"
                )
        unplaced = placed < 0
        if key is not None and unplaced.any():
            hashed = partitions_of(key, partitions)
            placed = np.where(unplaced, hashed, placed)
            unplaced = placed < 0
        if unplaced.any():
            seen = self._sticky.get(topic, 0)
            ordinal = seen + np.cumsum(unplaced) - 1
            sticky = (self.spark_partition + ordinal // STICKY_ROWS) % partitions
            placed = np.where(unplaced, sticky, placed)
            self._sticky[topic] = seen + int(unplaced.sum())
        return placed

    def partition_count(self, topic: str) -> int:
        """The topic's partitions: as the job saw them first, and still so (a task's first
        Metadata waits out an unreachable cluster within the delivery timeout, as its later
        questions do)."""
        now = self._retrying(lambda: self.cluster.layout(topic)).partitions  # (cached)
        pinned = self.topic_partitions.setdefault(topic, now)
        if now != pinned:
            raise RowsDiffer(
                f"topic {topic!r} has {now} partitions, not the {pinned} it had when the "
                "job started: keyed rows would go to other partitions than the job's first "
                "rows did"
            )
        return pinned

    def expect(self, tp: TopicPartition, sequence: int, fingerprint: int) -> None:
        """The PID wrote ``tp``'s rows through ``sequence``, with ``fingerprint``: checked
        before anything is sent, as what :meth:`_describe` finds."""
        state = self.partitions.get(tp)
        if state is None:
            self.cluster.leader(tp)
            state = self.partitions[tp] = _PartitionState()
        state.written_through = max(state.written_through, sequence)
        state.expected = _Expected(sequence, fingerprint, initial=True)
        self._pending_checks += 1

    @property
    def checked(self) -> bool:
        """Whether every row that :meth:`expect` names has been checked."""
        return not self._pending_checks

    def _add(self, tp: TopicPartition, rows: Canonical) -> None:
        """A partition's next rows (in order): checked, skipped or batched."""
        state = self.partitions.get(tp)
        if state is None:
            state = self._start(tp)
        count, first = len(rows), state.next_sequence
        if first + count > SEQUENCE_LIMIT:
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: more than {SEQUENCE_LIMIT} rows from one Spark partition"
            )
        expected = state.expected
        if expected is not None and first <= expected.sequence < first + count:
            through = rows.slice(0, expected.sequence - first + 1)
            self._check(tp, state, through.fingerprint(state.fingerprint))
        skip = min(max(state.written_through - first + 1, 0), count)
        if skip:
            if state.open_rows:
                self._ship(tp, state)
            state.fingerprint = rows.slice(0, skip).fingerprint(state.fingerprint)
            state.next_sequence += skip
            state.skipped_rows += skip
            rows = rows.slice(skip, count)
        room = self.settings.batch_bytes - BATCH_HEADER.size - STAMP_ROOM
        while len(rows):
            if not state.open_rows:
                state.open_first, state.open_fingerprint = state.next_sequence, state.fingerprint
            sizes = np.cumsum(rows.sizes() + RECORD_OVERHEAD)
            fit = int(np.searchsorted(sizes, room - state.open_bytes, side="right"))
            if not state.open_rows:
                fit = max(fit, 1)  # a row too big for a batch goes alone (the broker judges)
            piece = rows.slice(0, fit)
            taken = int(sizes[fit - 1]) if fit else 0
            if fit:
                state.fingerprint = piece.fingerprint(state.fingerprint)
                state.open_chunks.append(piece.rows)
                state.open_rows += fit
                state.open_bytes += taken
                state.next_sequence += fit
                self._open_bytes += taken
            rows = rows.slice(fit, len(rows))
            if len(rows):
                self._ship(tp, state)  # full
        if self._open_bytes > self.settings.buffer_bytes:
            for open_tp, open_state in self.partitions.items():
                if open_state.open_rows:
                    self._ship(open_tp, open_state)

    # -- what earlier attempts wrote ----------------------------------------------------------

    def _start(self, tp: TopicPartition) -> _PartitionState:
        self.cluster.leader(tp)  # the topic exists and the partition is in range
        if self.resume and tp[0] not in self._described:
            self._describe(tp[0])
        return self.partitions.setdefault(tp, _PartitionState())

    def _describe(self, topic: str) -> None:
        """LastSequence of this PID on every partition of ``topic`` (one DescribeProducers per
        leader): the rows up to it are skipped, and must be the ones written (checked by
        the fingerprint of the batch that ends there, before anything is sent)."""
        count = self.partition_count(topic)
        found = self._retrying(
            lambda: self.cluster.describe_producers((topic, p) for p in range(count))
        )
        for tp, producers in sorted(found.items()):
            mine = self._mine(tp, producers)
            state = self.partitions.setdefault(tp, _PartitionState())
            if mine is None or mine.last_sequence <= state.written_through:
                continue
            stamp = self._stamp_of(tp, mine)
            if stamp.partitions != count:
                raise RowsDiffer(
                    f"{tp[0]}-{tp[1]}: producer {self.producer_id} wrote its rows when topic "
                    f"{topic!r} had {stamp.partitions} partitions; it has {count} now, so "
                    "keyed rows would go to other partitions: run it as a new version"
                )
            state.written_through = mine.last_sequence
            state.expected = _Expected(mine.last_sequence, stamp.fingerprint, initial=True)
            self._pending_checks += 1
        self._described.add(topic)

    def _mine(self, tp: TopicPartition, producers: list[ProducerState]) -> ProducerState | None:
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
            return producer
        return None

    def _stamp_of(self, tp: TopicPartition, mine: ProducerState) -> Stamp:
        """The stamp on the batch ``mine`` reports as the PID's last in ``tp``."""
        found = self._retrying(
            lambda: self.cluster.find_batch(
                tp, self.producer_id, mine.last_sequence, mine.last_timestamp
            )
        )
        stamp = None
        if found is not None:
            stamp = Stamp.read(found.records()[0].header(FINGERPRINT_HEADER))
        if stamp is None:
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: cannot read what producer {self.producer_id} wrote through "
                f"sequence {mine.last_sequence} (its last batch is gone, or was not written by "
                "this version of pidctl-kafka), so this attempt cannot check its rows are the "
                "same: run it as a new version"
            )
        self.started_ms = min(self.started_ms, stamp.started_ms)
        age = int(time.time() * 1000) - stamp.started_ms
        if self.expiration_ms is not None and age >= self.expiration_ms:
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: producer {self.producer_id}'s rows were written by a run that "
                f"started {age} ms ago, at least the brokers' producer.id.expiration.ms "
                f"({self.expiration_ms}): they may have forgotten some, and this attempt would "
                "write them again; run it as a new version (and keep jobs shorter than the "
                "expiration)"
            )
        return stamp

    def _check(self, tp: TopicPartition, state: _PartitionState, fingerprint: int) -> None:
        expected = state.expected
        assert expected is not None
        if fingerprint != expected.fingerprint:
            raise RowsDiffer(
                f"{tp[0]}-{tp[1]}: this attempt's first {expected.sequence + 1} rows are not "
                f"the ones producer {self.producer_id} already wrote (another data set, a "
                "non-deterministic input, or another partitioning): nothing of them is sent; "
                "run it as a new version"
            )
        state.expected = None
        if expected.initial:
            self._pending_checks -= 1
            if not self._pending_checks:
                held, self._held, self._held_bytes = self._held, [], 0
                for waiting in held:
                    self._send(waiting)

    # -- batches out ------------------------------------------------------------------------

    def _ship(self, tp: TopicPartition, state: _PartitionState) -> None:
        """Send the partition's open batch (after resolving its failed ones, if any)."""
        chunks = state.open_chunks
        rows = Canonical(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks))
        sent = _Batch(tp, state.open_first, rows, state.open_fingerprint, state.fingerprint)
        self._open_bytes -= state.open_bytes
        state.open_chunks, state.open_rows, state.open_bytes = [], 0, 0
        if self.dry_run:
            return
        if self._pending_checks:
            self._held.append(sent)
            self._held_bytes += rows.rows.nbytes
            if self._held_bytes > HOLD_LIMIT_BYTES:
                self._differs_unchecked()
            return
        if state.failed:
            self._settle(tp, state)
        self._send(sent)

    def _differs_unchecked(self) -> None:
        pending = [
            f"{tp[0]}-{tp[1]} (sequence {s.expected.sequence})"
            for tp, s in sorted(self.partitions.items())
            if s.expected is not None and s.expected.initial
        ]
        raise RowsDiffer(
            f"producer {self.producer_id} already wrote rows this attempt does not reach: "
            f"{', '.join(pending)}: its rows are not the ones written (another data set, "
            "a non-deterministic input, or another partitioning); nothing of them is sent; "
            "run it as a new version"
        )

    def _send(self, sent: _Batch) -> None:
        """Send ``sent``'s rows after the partition's LastSequence (all, usually)."""
        state = self.partitions[sent.partition]
        # A leader takes a PID it has not seen at any sequence (it checks sequences from a
        # producer's first batch on), so a batch landing while an earlier one waits for a
        # leader would leave a gap that LastSequence cannot show: until one batch of the
        # partition is answered, the earlier ones are settled before another is sent.
        while state.written_through < 0 and (state.in_flight or state.failed):
            self._settle(sent.partition, state)
        first = max(sent.first, state.written_through + 1)
        if first > sent.last:
            state.skipped_rows += len(sent.rows)
            return
        if first > sent.first:
            state.skipped_rows += first - sent.first
            kept = sent.rows.slice(first - sent.first, len(sent.rows))
            sent = _Batch(
                sent.partition, first, kept, sent.fingerprint_at(first - 1), sent.fingerprint_after
            )
        tp = sent.partition
        app_id, version = self.name or ("", -1)
        stamp = Stamp(
            self.partition_count(tp[0]), sent.fingerprint_after, self.started_ms, version, app_id
        )
        head = record(first_record(sent.rows.rows[0].as_py(), stamp.header()), 0)
        parts = [head]
        if len(sent.rows) > 1:
            parts.append(records(sent.rows.slice(1, len(sent.rows)), 1))
        encoded = batch(
            parts,
            len(sent.rows),
            producer_id=self.producer_id,
            epoch=self.epoch,
            base_sequence=sent.first,
            timestamp_ms=self._stamp_ms,
            compression=self.settings.compression,
        )
        leader = self.cluster.layout(tp[0]).leaders[tp[1]]
        if leader < 0:
            self._failed(sent, ErrorCode.leader_not_available)
            return
        while len(self._in_flight.setdefault(leader, deque())) >= MAX_IN_FLIGHT:
            self._receive(leader)
        timeout = int(self.settings.request_timeout_s * 1000)
        body = produce_body(tp[0], tp[1], encoded, acks=ACKS_ALL, timeout_ms=timeout)
        try:
            self.cluster.producer(leader).send_parts(PRODUCE, PRODUCE_VERSION, body)
        except (OSError, KafkaUnavailable):
            self._connection_lost(leader)
            self._failed(sent, ErrorCode.network_exception)
            return
        self._in_flight.setdefault(leader, deque()).append(sent)
        state.in_flight += 1

    def _receive(self, leader: int) -> None:
        """The answer to the oldest batch in flight to ``leader``."""
        queue = self._in_flight[leader]
        try:
            response = self.cluster.producer(leader).receive()
        except (OSError, KafkaUnavailable):
            self._connection_lost(leader)
            return
        sent = queue.popleft()
        state = self.partitions[sent.partition]
        state.in_flight -= 1
        answer = response.responses[0].partition_responses[0]
        if answer.error_code:
            self._failed(sent, answer.error_code, answer.error_message)
            return
        state.sent_rows += len(sent.rows)
        state.written_through = max(state.written_through, sent.last)
        state.failing_since, state.attempts = None, 0

    def _connection_lost(self, leader: int) -> None:
        """Every batch in flight to ``leader`` failed: resolved by LastSequence later."""
        self.cluster.drop(leader)
        queue = self._in_flight.pop(leader, deque())
        while queue:
            lost = queue.popleft()
            self.partitions[lost.partition].in_flight -= 1
            self._failed(lost, ErrorCode.network_exception)

    def _failed(self, failed: _Batch, error: ErrorCode, message: str | None = None) -> None:
        tp = failed.partition
        if error not in RETRIABLE:
            detail = f" ({message})" if message else ""
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: Kafka refused a batch of producer {self.producer_id}: "
                f"{error.name.upper()}{detail}"
            )
        state = self.partitions[tp]
        state.failed.append(failed)
        if state.failing_since is None:
            state.failing_since = self.clock()

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

    def _give_up_if_due(self, tp: TopicPartition, state: _PartitionState, why: str) -> None:
        since = state.failing_since if state.failing_since is not None else self.clock()
        failing = self.clock() - since
        if failing > self.settings.delivery_timeout_s or state.attempts > self.settings.retries:
            raise KafkaWriteError(
                f"{tp[0]}-{tp[1]}: gave up after {failing:.1f} s and {state.attempts} retries "
                f"(kafka.delivery.timeout.ms {int(self.settings.delivery_timeout_s * 1000)}, "
                f"kafka.retries {self.settings.retries}; producer {self.producer_id}): {why}"
            )

    def _backoff(self, attempts: int) -> float:
        base, most = self.settings.retry_backoff_s, self.settings.retry_backoff_max_s
        return float(min(most, base * 2 ** max(attempts - 1, 0)))

    def _resolve(self, tp: TopicPartition, state: _PartitionState) -> None:
        """Every failed batch of ``tp`` is sent again from the PID's LastSequence on, once
        none of the partition's batches is in flight any more; a broker that does not answer
        is asked again after a pause, within the delivery timeout."""
        state.attempts += 1
        self._give_up_if_due(tp, state, "the batch could not be written")
        time.sleep(self._backoff(state.attempts))
        try:
            self.cluster.refresh([tp[0]])
            (producers,) = self.cluster.describe_producers([tp]).values()
            mine = self._mine(tp, producers)
            if mine is not None and mine.last_sequence > state.written_through:
                self._learn(tp, state, mine)
        except KafkaUnavailable:
            return  # asked again on the next round, until the delivery timeout
        failed, state.failed = sorted(state.failed, key=lambda b: b.first), []
        for retried in failed:
            self._send(retried)

    def _learn(self, tp: TopicPartition, state: _PartitionState, mine: ProducerState) -> None:
        """The PID's rows reach ``mine.last_sequence`` in ``tp``: beyond what this attempt
        knew was written. At the end of one of its own batches it is its own write whose
        answer was lost; anywhere else another attempt wrote them (a speculative copy, say),
        and its rows are checked against this one's."""
        last = mine.last_sequence
        if any(b.last == last for b in state.failed):
            # Its own batches up to there were written: their answers were lost.
            for written in [b for b in state.failed if b.last <= last]:
                first = max(written.first, state.written_through + 1)
                state.sent_rows += max(written.last - first + 1, 0)
                state.failed.remove(written)
        else:
            stamp = self._stamp_of(tp, mine)
            mine_so_far = self._fingerprint_at(state, last)
            if mine_so_far is None:
                state.expected = _Expected(last, stamp.fingerprint, initial=False)
            elif mine_so_far != stamp.fingerprint:
                state.expected = _Expected(last, stamp.fingerprint, initial=False)
                self._check(tp, state, mine_so_far)
        state.written_through = last

    def _fingerprint_at(self, state: _PartitionState, sequence: int) -> int | None:
        """This attempt's fingerprint through ``sequence``, if it has that row yet."""
        if sequence >= state.next_sequence:
            return None
        for failed in state.failed:
            if failed.first <= sequence <= failed.last:
                return failed.fingerprint_at(sequence)
        if state.open_rows and state.open_first <= sequence:
            chunks = state.open_chunks
            rows = Canonical(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks))
            return rows.slice(0, sequence - state.open_first + 1).fingerprint(
                state.open_fingerprint
            )
        return None

    def _retrying(self, ask: Callable[[], Any]) -> Any:
        """``ask()`` again after a pause while the cluster does not answer, at most the
        delivery timeout."""
        since, attempts = self.clock(), 0
        while True:
            try:
                return ask()
            except KafkaUnavailable as e:
                attempts += 1
                if self.clock() - since > self.settings.delivery_timeout_s:
                    raise KafkaWriteError(
                        f"gave up after {attempts} tries in "
                        f"{self.settings.delivery_timeout_s:.0f} s "
                        f"(kafka.delivery.timeout.ms): {e}"
                    ) from e
                time.sleep(self._backoff(attempts))
                with contextlib.suppress(KafkaUnavailable):
                    self.cluster.refresh(list(self.cluster.topics))

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> list[PartitionReport]:
        """Send what is open, wait for every answer (resolving failures), and report."""
        for tp, state in self.partitions.items():
            if state.open_rows:
                self._ship(tp, state)
        if self._pending_checks:
            self._differs_unchecked()
        while True:
            for leader in list(self._in_flight):
                while self._in_flight.get(leader):
                    self._receive(leader)
            pending = [(tp, s) for tp, s in self.partitions.items() if s.failed]
            if not pending and not any(self._in_flight.values()):
                break
            for tp, state in pending:
                self._settle(tp, state)
        unreached = [f"{tp[0]}-{tp[1]}" for tp, s in sorted(self.partitions.items()) if s.expected]
        if unreached:
            raise RowsDiffer(
                f"another attempt of producer {self.producer_id} wrote more rows to "
                f"{', '.join(unreached)} than this one has: the attempts' rows differ"
            )
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
