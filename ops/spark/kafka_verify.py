"""Checks afterwards, from the brokers, that a named job version's rows landed once
(``pidctl kafka verify``, or :func:`verify_version`).

Every batch ``pidctl-kafka`` writes carries a stamp on its first record (``kafka_records``):
the job version's name, and the fingerprint of the producer's rows in that partition through
the batch's last row. The verifier reads the topic's partitions (from ``since_ms`` on, or from
their start) and finds the version's batches by their stamps, hence the version's producer
ids; then, per producer and partition:

- **repeated**: a sequence written more than once (by the same producer id at another epoch,
  say: the brokers drop a re-send of the same one);
- **missing**: a sequence below the producer's last that is not there, or fewer rows than
  the partition leader says the producer wrote (its LastSequence, DescribeProducers);
- **differing**: rows whose fingerprint is not the one their last batch was stamped with;

and over the rows read: **duplicate rows**, a row of the version (its key, value and headers)
that appears more than once — written twice by the version's producers, or copied by any
other producer in the range read (Spark's own sink re-sending it, a manual re-send). A job
whose input holds identical rows sees them counted here: they are identical in Kafka too.

Everything zero: the version's rows are in the topic once each.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from crc32c import crc32c

from pidctl.spark.kafka_cluster import KafkaCluster
from pidctl.spark.kafka_records import FINGERPRINT_HEADER, Stamp

#: How far before ``since_ms`` the read starts: the tasks stamp their batches with their
#: executors' clocks, which may be behind the driver's.
CLOCK_SLACK_MS = 600_000


@dataclass
class _Producer:
    """What one producer id of the version wrote to one partition, read in offset order
    (which is its sequences' order): the sequences seen, and the fingerprint of its rows
    while they come without a gap, checked against each batch's stamp."""

    sequences: Counter[int] = field(default_factory=Counter)
    contiguous: int = 0  # the rows 0..contiguous-1 arrived, in order
    fingerprint: int = 0
    differing: int = 0

    def add(self, rows: list[tuple[int, bytes]], last: int, stamped: int | None) -> None:
        """A batch's rows (sequence, canonical bytes) and its last sequence."""
        for sequence, row in rows:
            self.sequences[sequence] += 1
            if sequence == self.contiguous:
                self.fingerprint = crc32c(row, self.fingerprint)
                self.contiguous += 1
        if stamped is not None and last == self.contiguous - 1 and stamped != self.fingerprint:
            self.differing += len(rows)


@dataclass(frozen=True, slots=True)
class PartitionCheck:
    """One partition of the topic, as far as the version is concerned."""

    partition: int
    producers: int
    rows: int
    repeated: int
    missing: int
    differing: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`verify_version` found."""

    topic: str
    app_id: str
    version: int
    rows: int
    repeated: int
    missing: int
    differing: int
    duplicate_rows: int
    expected_rows: int | None
    partitions: tuple[PartitionCheck, ...]

    @property
    def ok(self) -> bool:
        """The version's rows are in the topic once each (and as many as expected)."""
        counts = (self.repeated, self.missing, self.differing, self.duplicate_rows)
        if any(counts) or not self.rows:
            return False
        return self.expected_rows is None or self.rows == self.expected_rows

    def lines(self) -> list[str]:
        """A human summary."""
        head = (
            f"{self.topic}: version {self.version} of {self.app_id!r}: {self.rows} rows, "
            f"{self.repeated} repeated, {self.missing} missing, {self.differing} differing, "
            f"{self.duplicate_rows} duplicate rows"
        )
        if self.expected_rows is not None:
            head += f" (expected {self.expected_rows})"
        lines = [head + (": landed once" if self.ok else ": NOT landed once")]
        lines += [
            f"  partition {p.partition}: {p.rows} rows from {p.producers} producers, "
            f"{p.repeated} repeated, {p.missing} missing, {p.differing} differing"
            for p in self.partitions
        ]
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "app_id": self.app_id,
            "version": self.version,
            "ok": self.ok,
            "rows": self.rows,
            "repeated": self.repeated,
            "missing": self.missing,
            "differing": self.differing,
            "duplicate_rows": self.duplicate_rows,
            "expected_rows": self.expected_rows,
            "partitions": [_fields(p) for p in self.partitions],
        }


def _fields(check: PartitionCheck) -> dict[str, int]:
    return {name: getattr(check, name) for name in PartitionCheck.__slots__}


def verify_version(
    cluster: KafkaCluster,
    topic: str,
    app_id: str,
    version: int,
    *,
    since_ms: int | None = None,
    expected_rows: int | None = None,
) -> Verdict:
    """Read ``topic`` (from ``since_ms``, less :data:`CLOCK_SLACK_MS`, or from each
    partition's start) and check that the rows of job version ``(app_id, version)`` are in it
    once each (module doc)."""
    partitions = cluster.layout(topic).partitions
    checks: list[PartitionCheck] = []
    #: A 64-bit hash of each row read: the version's, and every other producer's.
    version_rows: list[int] = []
    other_rows: list[int] = []
    for partition in range(partitions):
        tp = (topic, partition)
        start = cluster.start_offset(tp)
        if since_ms is not None:
            found = cluster.offset_for_time(tp, since_ms - CLOCK_SLACK_MS)
            start = cluster.end_offset(tp) if found < 0 else max(start, found)
        producers: dict[int, _Producer] = defaultdict(_Producer)
        for batch in cluster.batches(tp, start):
            if batch.is_control:
                continue
            records = batch.records()
            stamp = Stamp.read(records[0].header(FINGERPRINT_HEADER)) if records else None
            ours = stamp is not None and stamp.app_id == app_id and stamp.version == version
            # Records below the start (deleted: a batch is returned whole) are left out, as a
            # consumer leaves them out; a record's sequence is its batch's plus its offset's.
            rows = [
                (batch.base_sequence + r.offset - batch.base_offset, r.canonical())
                for r in records
                if r.offset >= start
            ]
            if not ours and batch.producer_id not in producers:
                other_rows += (hash(row) for _, row in rows)
                continue
            version_rows += (hash(row) for _, row in rows)
            fingerprint = stamp.fingerprint if stamp is not None else None
            producers[batch.producer_id].add(rows, batch.last_sequence, fingerprint)
        leaders = cluster.describe_producers([tp]).get(tp, [])
        last_known = {p.producer_id: p.last_sequence for p in leaders}
        repeated = missing = rows_here = differing = 0
        for producer_id, seen in producers.items():
            if not seen.sequences:
                continue
            top = max(seen.sequences)
            repeated += sum(count - 1 for count in seen.sequences.values())
            missing += top + 1 - len(seen.sequences)
            missing += max(last_known.get(producer_id, top) - top, 0)
            rows_here += len(seen.sequences)
            differing += seen.differing
        checks.append(
            PartitionCheck(partition, len(producers), rows_here, repeated, missing, differing)
        )
    ours_hashed = np.asarray(version_rows, dtype=np.int64)
    distinct, counts = np.unique(ours_hashed, return_counts=True)
    duplicates = int((counts - 1).sum())
    if other_rows:
        duplicates += int(np.isin(np.asarray(other_rows, dtype=np.int64), distinct).sum())
    return Verdict(
        topic,
        app_id,
        version,
        sum(c.rows for c in checks),
        sum(c.repeated for c in checks),
        sum(c.missing for c in checks),
        sum(c.differing for c in checks),
        duplicates,
        expected_rows,
        tuple(checks),
    )


def verify(
    bootstrap_servers: list[str],
    topic: str,
    app_id: str,
    version: int,
    *,
    properties: dict[str, str] | None = None,
    since_ms: int | None = None,
    expected_rows: int | None = None,
    timeout_s: float = 60.0,
) -> Verdict:
    """:func:`verify_version` against the cluster at ``bootstrap_servers`` (Kafka client
    ``properties`` without the ``kafka.`` prefix: ``security.protocol``, ``sasl.*``,
    ``ssl.truststore.location``)."""
    from pidctl.spark.kafka_options import kafka_connection

    cluster = KafkaCluster(
        bootstrap_servers,
        client_id="pidctl-kafka-verify",
        timeout_s=timeout_s,
        connection=kafka_connection(properties or {}),
    )
    try:
        return verify_version(
            cluster, topic, app_id, version, since_ms=since_ms, expected_rows=expected_rows
        )
    finally:
        cluster.close()
