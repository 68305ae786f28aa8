"""AllocateProducerIds requests read by struct are read as kio reads them, and answered with
the bytes kio's writer makes; anything unusual is left to kio."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, response_class, supported_apis
from pidctl.protocol.block_requests import BlockRequested, block_request_of, read_block_request
from pidctl.protocol.codec import (
    ProtocolViolation,
    allocate_producer_ids_answer,
    decode_request,
    encode_request,
)
from pidctl.protocol.codec import encode_response_generic as kio_encoded
from pidctl.protocol.headers import RequestHeader
from tests.protocol.frames import client_ids, damaged, int32s, int64s, read_only_as_kio_reads

SUPPORTED = supported_apis({ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0), ApiKey.API_VERSIONS: (0, 4)})


@st.composite
def block_frames(draw: st.DrawFn) -> bytes:
    """An AllocateProducerIds frame as a broker or a job sends it (without its length)."""
    body = requests.allocate(draw(int32s), draw(int64s))
    return encode_request(body, draw(int32s), draw(client_ids))[4:]


def _kio_reads_it_so(frame: bytes, read: BlockRequested) -> None:
    request = decode_request(frame, SUPPORTED)
    assert (request.api_key, request.api_version) == (ApiKey.ALLOCATE_PRODUCER_IDS, 0)
    assert read == block_request_of(request)
    assert read == BlockRequested(
        request.header.correlation_id,
        request.header.client_id,
        request.body.broker_id,
        request.body.broker_epoch,
    )


@given(block_frames())
def test_every_block_request_is_read_as_kio_reads_it(frame: bytes) -> None:
    read = read_block_request(frame)
    assert read is not None
    _kio_reads_it_so(frame, read)


@given(block_frames(), st.data())
def test_a_damaged_frame_is_read_only_as_kio_reads_it(frame: bytes, data: st.DataObject) -> None:
    """Truncated, extended or with a byte changed: whatever the struct reader accepts, kio
    reads as the same request (what it leaves, kio reads or refuses)."""
    read_only_as_kio_reads(damaged(frame, data), read_block_request, _kio_reads_it_so, SUPPORTED)


def test_tagged_fields_and_other_apis_are_left_to_kio() -> None:
    frame = encode_request(requests.allocate(7, 3), 1, "c")[4:]
    assert read_block_request(frame) == BlockRequested(1, "c", 7, 3)
    tagged_body = frame[:-1] + b"\x01\x00\x00"  # one empty tagged field (tag 0, size 0)
    assert read_block_request(tagged_body) is None
    with pytest.raises(ProtocolViolation):  # (kio knows no tag of this API: it refuses)
        decode_request(tagged_body, SUPPORTED)
    assert read_block_request(encode_request(requests.api_versions(), 1, "c")[4:]) is None
    # A client id that is not UTF-8 is read as Kafka reads it (headers.client_id_of).
    not_utf8 = frame.replace(b"\x00\x01c", b"\x00\x01\xff")
    assert read_block_request(not_utf8) == BlockRequested(1, "\ufffd", 7, 3)
    assert read_block_request(encode_request(requests.allocate(-1, -1), 2, None)[4:]) == (
        BlockRequested(2, None, -1, -1)
    )


@given(
    correlation_id=int32s,
    error=st.sampled_from(
        [ErrorCode.none, ErrorCode.stale_broker_epoch, ErrorCode.unknown_server_error]
    ),
    first=st.integers(0, 2**63 - 1),
    length=st.integers(0, 2**31 - 1),
)
def test_the_answers_are_kios_bytes(
    correlation_id: int, error: ErrorCode, first: int, length: int
) -> None:
    cls: Any = response_class(ApiKey.ALLOCATE_PRODUCER_IDS, 0)
    body = cls(
        throttle_time=datetime.timedelta(0),
        error_code=error,
        producer_id_start=i64(first),
        producer_id_len=i32(length),
    )
    header = RequestHeader(ApiKey.ALLOCATE_PRODUCER_IDS, 0, correlation_id, "c", 2)
    assert allocate_producer_ids_answer(correlation_id, error, first, length) == kio_encoded(
        header, body
    )
