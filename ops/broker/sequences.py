"""Kafka's producer-sequence rules for one partition, pure (no I/O but snapshot files).

Per producer id the table keeps the epoch and the last N batches (first and last sequence,
first offset), N at least 5 (KIP-1269's ``producer.state.batches.to.retain``), or in
"latest" mode only the last sequence (KAFKA-12207). A batch is checked as Kafka's
ProducerAppendInfo checks it:

- an epoch below the producer's: ``INVALID_PRODUCER_EPOCH``;
- a higher epoch (a bump) must start at sequence 0, and resets the sequences;
- the same epoch: a retained batch sent again is a duplicate, answered with its original
  offsets; the next sequence (``last + 1``, wrapping from 2^31-1 to 0) is appended; a batch
  behind the last one that is no longer retained is ``DUPLICATE_SEQUENCE_NUMBER``; anything
  else is ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
- an unknown producer is accepted at any sequence (Kafka since KIP-360: its state may have
  expired), or, with ``unknown_producer="reject"``, only at sequence 0, else
  ``UNKNOWN_PRODUCER_ID`` (Kafka before 2.5).

Memory: a retained batch is 16 bytes in an ``array('q')`` (first and last sequence packed
in one int64, first offset in the other), against ~36 bytes in Kafka's Java structures.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

SEQUENCE_LIMIT = 2**31  # sequences are int32 >= 0 and wrap from 2^31-1 to 0
MIN_BATCHES_TO_RETAIN = 5
#: Kafka's producer.id.expiration.ms default: one day.
DEFAULT_EXPIRATION_MS = 86_400_000
#: In latest mode, sequences this far below the last one count as duplicates.
DEFAULT_DUPLICATE_WINDOW = 1 << 20


def last_sequence(first_seq: int, record_count: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: wraps from 2^31-1 to 0."""
    return (first_seq + record_count - 1) % SEQUENCE_LIMIT


def _behind(seq: int, last: int, window: int) -> bool:
    """``seq`` is at or before ``last`` within ``window`` (modulo the wrap)."""
    return (last - seq) % SEQUENCE_LIMIT < window


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one batch. A duplicate is not an error: Kafka answers it with the
    offsets of the original append (``first_offset``/``last_offset``)."""

    error: ErrorCode = ErrorCode.none
    duplicate: bool = False
    first_offset: int = -1
    last_offset: int = -1

    @property
    def appendable(self) -> bool:
        return self.error == ErrorCode.none and not self.duplicate


class _Producer:
    __slots__ = ("batches", "epoch", "last_offset", "last_seq", "updated_ms")

    def __init__(self, epoch: int, updated_ms: int) -> None:
        self.epoch = epoch
        self.updated_ms = updated_ms
        self.batches = array("q")  # pairs: (first_seq << 32 | last_seq, first_offset)
        self.last_seq = -1
        self.last_offset = -1


class ProducerStateTable:
    """The producer state of one partition."""

    def __init__(
        self,
        batches_to_retain: int = MIN_BATCHES_TO_RETAIN,
        *,
        mode: str = "batches",
        duplicate_window: int = DEFAULT_DUPLICATE_WINDOW,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
        unknown_producer: str = "accept",
    ) -> None:
        if batches_to_retain < MIN_BATCHES_TO_RETAIN:
            raise ValueError(f"batches_to_retain must be at least {MIN_BATCHES_TO_RETAIN}")
        if mode not in ("batches", "latest") or unknown_producer not in ("accept", "reject"):
            raise ValueError("mode is batches or latest; unknown_producer is accept or reject")
        self.batches_to_retain = batches_to_retain
        self.mode = mode
        self.duplicate_window = duplicate_window
        self.expiration_ms = expiration_ms
        self.unknown_producer = unknown_producer
        self._producers: dict[int, _Producer] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def epoch_of(self, producer_id: int) -> int | None:
        producer = self._producers.get(producer_id)
        return None if producer is None else producer.epoch

    def check(self, producer_id: int, epoch: int, first_seq: int, record_count: int) -> Verdict:
        """What appending this batch would do, changing nothing."""
        last = last_sequence(first_seq, record_count)
        producer = self._producers.get(producer_id)
        if producer is None:
            if self.unknown_producer == "reject" and first_seq != 0:
                return Verdict(ErrorCode.unknown_producer_id)
            return Verdict()
        if epoch < producer.epoch:
            return Verdict(ErrorCode.invalid_producer_epoch)
        if epoch > producer.epoch:
            return Verdict() if first_seq == 0 else Verdict(ErrorCode.out_of_order_sequence_number)
        if self.mode == "batches":
            key = first_seq << 32 | last
            batches = producer.batches
            for i in range(0, len(batches), 2):
                if batches[i] == key:
                    first_offset = batches[i + 1]
                    return Verdict(
                        duplicate=True,
                        first_offset=first_offset,
                        last_offset=first_offset + record_count - 1,
                    )
        elif first_seq == self._first_of_last(producer) and last == producer.last_seq:
            return Verdict(
                duplicate=True,
                first_offset=producer.last_offset - record_count + 1,
                last_offset=producer.last_offset,
            )
        if first_seq == (producer.last_seq + 1) % SEQUENCE_LIMIT:
            return Verdict()
        window = self.duplicate_window if self.mode == "latest" else SEQUENCE_LIMIT // 2
        if _behind(last, producer.last_seq, window):
            return Verdict(ErrorCode.duplicate_sequence_number)
        return Verdict(ErrorCode.out_of_order_sequence_number)

    @staticmethod
    def _first_of_last(producer: _Producer) -> int:
        return -1 if not producer.batches else producer.batches[-2] >> 32

    def append(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        record_count: int,
        first_offset: int,
        now_ms: int,
    ) -> Verdict:
        """Check the batch and, if it is appendable, record it at ``first_offset``."""
        verdict = self.check(producer_id, epoch, first_seq, record_count)
        if not verdict.appendable:
            return verdict
        producer = self._producers.get(producer_id)
        if producer is None or epoch > producer.epoch:
            producer = self._producers[producer_id] = _Producer(epoch, now_ms)
        last = last_sequence(first_seq, record_count)
        producer.updated_ms = now_ms
        producer.last_seq = last
        producer.last_offset = first_offset + record_count - 1
        batches = producer.batches
        if self.mode == "batches":
            if len(batches) >= 2 * self.batches_to_retain:
                del batches[:2]
            batches.extend((first_seq << 32 | last, first_offset))
        else:
            # Latest mode keeps one batch only, for the exact-retry answer.
            del batches[:]
            batches.extend((first_seq << 32 | last, first_offset))
        return Verdict(first_offset=first_offset, last_offset=producer.last_offset)

    def expire(self, now_ms: int) -> int:
        """Forget producers not heard from for ``expiration_ms``; return how many."""
        old = [
            pid for pid, p in self._producers.items() if now_ms - p.updated_ms > self.expiration_ms
        ]
        for pid in old:
            del self._producers[pid]
        return len(old)

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self, path: Path) -> None:
        """Write the whole table atomically, with a checksum over everything."""
        parts = [_HEADER.pack(len(self._producers))]
        for pid, p in self._producers.items():
            parts.append(
                _ENTRY.pack(pid, p.epoch, p.updated_ms, p.last_seq, p.last_offset, len(p.batches))
            )
            parts.append(p.batches.tobytes())
        body = b"".join(parts)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_MAGIC + struct.pack(">I", zlib.crc32(body)) + body)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)

    def restore(self, path: Path) -> None:
        """Replace the table with a snapshot; a corrupt file raises and changes nothing."""
        data = path.read_bytes()
        if data[: len(_MAGIC)] != _MAGIC or len(data) < len(_MAGIC) + 4 + _HEADER.size:
            raise CorruptSnapshot(f"{path}: not a producer-state snapshot")
        (crc,) = struct.unpack_from(">I", data, len(_MAGIC))
        body = memoryview(data)[len(_MAGIC) + 4 :]
        if zlib.crc32(body) != crc:
            raise CorruptSnapshot(f"{path}: checksum mismatch")
        producers: dict[int, _Producer] = {}
        try:
            (count,) = _HEADER.unpack_from(body, 0)
            pos = _HEADER.size
            for _ in range(count):
                pid, epoch, updated, last_seq, last_offset, n = _ENTRY.unpack_from(body, pos)
                pos += _ENTRY.size
                producer = _Producer(epoch, updated)
                producer.last_seq, producer.last_offset = last_seq, last_offset
                producer.batches.frombytes(body[pos : pos + 8 * n])
                pos += 8 * n
                producers[pid] = producer
        except struct.error as e:
            raise CorruptSnapshot(f"{path}: truncated ({e})") from e
        if pos != len(body):
            raise CorruptSnapshot(f"{path}: {len(body) - pos} bytes after the last producer")
        self._producers = producers  # all or nothing


class CorruptSnapshot(Exception):
    """A producer-state snapshot failed its checks; nothing was loaded."""


_MAGIC = b"PIDSEQ01"
_HEADER = struct.Struct(">Q")
_ENTRY = struct.Struct(">qhqiqI")
