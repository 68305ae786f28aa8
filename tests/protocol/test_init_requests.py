"""InitProducerId requests read by struct are read as kio reads them, and answered with the
bytes kio's writer makes; anything unusual is left to kio."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, response_class, supported_apis
from pidctl.protocol.codec import (
    decode_request,
    encode_request,
    init_producer_id_answer,
)
from pidctl.protocol.codec import encode_response_generic as kio_encoded
from pidctl.protocol.headers import RequestHeader
from pidctl.protocol.init_requests import (
    VERSIONS,
    InitRequested,
    init_request_of,
    read_init_request,
)
from tests.protocol.frames import (
    client_ids,
    damaged,
    int16s,
    int32s,
    int64s,
    read_only_as_kio_reads,
)

SUPPORTED = supported_apis({ApiKey.INIT_PRODUCER_ID: (0, 5), ApiKey.API_VERSIONS: (0, 4)})
#: Transactional ids around the 126 bytes read here (longer: a two-byte compact length).
transactional_ids = st.none() | st.text(max_size=20) | st.text(min_size=120, max_size=130)


@st.composite
def init_frames(draw: st.DrawFn) -> bytes:
    """An InitProducerId frame as any client may send it (without its length prefix)."""
    version = draw(st.integers(0, 5))
    body = requests.init_producer_id(
        draw(transactional_ids),
        draw(int32s),
        producer_id=draw(st.sampled_from([-1, 0, 7]) | int64s),
        producer_epoch=draw(st.sampled_from([-1, 0, 7]) | int16s),
        version=version,
    )
    return encode_request(body, draw(int32s), draw(client_ids))[4:]


def _kio_reads_it_so(frame: bytes, read: InitRequested) -> None:
    request = decode_request(frame, SUPPORTED)
    body = request.body
    assert read == init_request_of(request)
    assert read == InitRequested(
        request.api_version,
        request.header.correlation_id,
        request.header.client_id,
        body.transactional_id,
        body.transaction_timeout // datetime.timedelta(milliseconds=1),
        getattr(body, "producer_id", -1),
        getattr(body, "producer_epoch", -1),
    )


@given(init_frames())
def test_every_request_is_read_as_kio_reads_it_or_left_to_kio(frame: bytes) -> None:
    """All but the transactional ids too long for a one-byte compact length."""
    read = read_init_request(frame, VERSIONS)
    body = decode_request(frame, SUPPORTED).body
    if read is None:
        assert frame[3] >= 2 and len(body.transactional_id.encode()) >= 127
    else:
        _kio_reads_it_so(frame, read)


@given(init_frames(), st.data())
def test_a_damaged_frame_is_read_only_as_kio_reads_it(frame: bytes, data: st.DataObject) -> None:
    """Truncated, extended or with a byte changed: whatever the struct reader accepts, kio
    reads as the same request (what it leaves, kio reads or refuses)."""
    read_only_as_kio_reads(
        damaged(frame, data), lambda f: read_init_request(f, VERSIONS), _kio_reads_it_so, SUPPORTED
    )


def test_versions_not_served_other_apis_and_bad_transactional_ids_are_left_alone() -> None:
    frame = encode_request(requests.init_producer_id("tx", version=5), 1, "c")[4:]
    assert read_init_request(frame, range(5)) is None
    assert read_init_request(frame, VERSIONS) == InitRequested(5, 1, "c", "tx", 60_000, -1, -1)
    other = encode_request(requests.api_versions(), 1, "c")[4:]
    assert read_init_request(other, VERSIONS) is None
    not_utf8_client = frame.replace(b"\x00\x01c", b"\x00\x01\xff")  # any client id (as Kafka)
    read = read_init_request(not_utf8_client, VERSIONS)
    assert read == InitRequested(5, 1, "\ufffd", "tx", 60_000, -1, -1)
    assert read_init_request(frame.replace(b"\x03tx", b"\x03t\xff"), VERSIONS) is None


@given(
    version=st.sampled_from(sorted(VERSIONS)),
    correlation_id=int32s,
    error=st.sampled_from(
        [ErrorCode.none, ErrorCode.producer_fenced, ErrorCode.coordinator_load_in_progress]
    ),
    producer_id=st.integers(-1, 2**63 - 1),
    producer_epoch=st.integers(-1, 2**15 - 1),
)
def test_the_answers_are_kios_bytes(
    version: int, correlation_id: int, error: ErrorCode, producer_id: int, producer_epoch: int
) -> None:
    cls: Any = response_class(ApiKey.INIT_PRODUCER_ID, version)
    body = cls(
        throttle_time=datetime.timedelta(0),
        error_code=error,
        producer_id=i64(producer_id),
        producer_epoch=i16(producer_epoch),
    )
    header = RequestHeader(ApiKey.INIT_PRODUCER_ID, version, correlation_id, "c", 2)
    answer = init_producer_id_answer(version, correlation_id, error, producer_id, producer_epoch)
    assert answer == kio_encoded(header, body)
