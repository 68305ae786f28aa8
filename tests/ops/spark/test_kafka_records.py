"""Record batches built a column at a time (ops/spark/kafka_records.py) are the bytes aiokafka's
builder (kafka-python's, compiled) builds for the same rows; what is read back is what was
written; a fingerprint does not depend on how the rows were cut into batches."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from pidctl.spark.kafka_options import COMPRESSION
from pidctl.spark.kafka_records import (
    FINGERPRINT_HEADER,
    Canonical,
    Stamp,
    batch,
    canonical,
    first_record,
    header_bytes,
    read_batches,
    record,
    records,
)

PID, EPOCH, SEQUENCE, STAMP_MS = 2**62 + 7, 0, 40, 1_700_000_000_000

_bytes = st.one_of(st.none(), st.binary(max_size=300))
_headers = st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3)
_rows = st.lists(st.tuples(_bytes, st.binary(max_size=300), _headers), min_size=1, max_size=40)


def _encoded(rows: list[tuple[Any, Any, Any]], stamp: Stamp, codec: int = 0) -> bytes:
    keys = pa.array([k for k, _, _ in rows], pa.binary())
    values = pa.array([v for _, v, _ in rows], pa.binary())
    headers = [header_bytes(h) for _, _, h in rows]
    rows_bytes = canonical(keys, values, headers)
    parts = [record(first_record(rows_bytes.rows[0].as_py(), stamp.header()), 0)]
    if len(rows) > 1:
        parts.append(records(rows_bytes.slice(1, len(rows)), 1))
    built = batch(
        parts,
        len(rows),
        producer_id=PID,
        epoch=EPOCH,
        base_sequence=SEQUENCE,
        timestamp_ms=STAMP_MS,
        compression=codec,
    )
    return b"".join(bytes(memoryview(part)) for part in built)


def _reference(rows: list[tuple[Any, Any, Any]], stamp: Stamp) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, PID, EPOCH, SEQUENCE, 10**8)
    for offset, (key, value, headers) in enumerate(rows):
        extra = [stamp.header()] if offset == 0 else []
        builder.append(offset, STAMP_MS, key, value, [*headers, *extra])
    return bytes(builder.build())


@settings(max_examples=150, deadline=None)
@given(_rows)
def test_a_batch_is_aiokafkas_for_the_same_rows(rows: list[tuple[Any, Any, Any]]) -> None:
    stamp = Stamp(6, 123, STAMP_MS, 7, "app/x y")
    assert _encoded(rows, stamp) == _reference(rows, stamp)


@settings(max_examples=60, deadline=None)
@given(_rows, st.integers(0, 40))
def test_a_fingerprint_goes_on_across_slices(rows: list[tuple[Any, Any, Any]], cut: int) -> None:
    keys = pa.array([k for k, _, _ in rows], pa.binary())
    values = pa.array([v for _, v, _ in rows], pa.binary())
    whole = canonical(keys, values, [header_bytes(h) for _, _, h in rows])
    cut = min(cut, len(rows))
    halves = whole.slice(cut, len(rows)).fingerprint(whole.slice(0, cut).fingerprint(0))
    assert halves == whole.fingerprint(0)


@pytest.mark.parametrize("codec", list(COMPRESSION))
def test_what_is_read_back_is_what_was_written(codec: str) -> None:
    rows = [
        (b"k%d" % i if i % 3 else None, b"v" * (i % 50), [("h", b"x")] if i % 4 else [])
        for i in range(500)
    ]
    stamp = Stamp(3, 99, STAMP_MS, 11, "nightly")
    data = _encoded(rows, stamp, COMPRESSION[codec])
    assert DefaultRecordBatch(bytearray(data)).validate_crc()
    (read,) = read_batches(data + b"\x00" * 30)  # a cut-off next batch is left out
    assert (read.producer_id, read.base_sequence, read.count) == (PID, SEQUENCE, 500)
    assert read.last_sequence == SEQUENCE + 499
    back = read.records()
    assert [
        (r.key, r.value, [h for h in r.headers if h[0] != FINGERPRINT_HEADER]) for r in back
    ] == [(k, v, list(h)) for k, v, h in rows]
    assert Stamp.read(back[0].header(FINGERPRINT_HEADER)) == stamp
    # A row's canonical bytes read back are the ones written (the fingerprint's input).
    keys = pa.array([k for k, _, _ in rows], pa.binary())
    values = pa.array([v for _, v, _ in rows], pa.binary())
    written = canonical(keys, values, [header_bytes(h) for _, _, h in rows])
    assert [r.canonical() for r in back] == written.rows.to_pylist()


def test_a_stamp_is_read_only_if_it_is_one() -> None:
    stamp = Stamp(8, 2**32 - 1, 5, 2**62, "a name with spaces/and slashes")
    assert Stamp.read(stamp.header()[1]) == stamp
    for value in (None, b"", b"v1 1 2", b"v2 1 2 3 4 app", b"v1 x 2 3 4 app"):
        assert Stamp.read(value) is None


def test_strings_are_their_utf8_bytes() -> None:
    text = canonical(pa.array(["ü", None]), pa.array(["ä€", "x"]))
    raw = canonical(pa.array(["ü".encode(), None]), pa.array(["ä€".encode(), b"x"]))
    assert isinstance(text, Canonical)
    assert text.rows.to_pylist() == raw.rows.to_pylist()
