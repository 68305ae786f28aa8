"""Idempotent InitProducerIds read by struct are read as kio reads them, and answered with
the bytes kio's writer makes; anything unusual is left to kio."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, response_class, supported_apis
from pidctl.protocol.codec import decode_request, encode_request
from pidctl.protocol.codec import encode_response_generic as kio_encoded
from pidctl.protocol.headers import RequestHeader
from pidctl.protocol.idempotent_inits import VERSIONS, answer_run, read_idempotent_init, shapes
from tests.protocol.frames import client_ids, damaged, int32s, read_only_as_kio_reads

SERVED = shapes(VERSIONS)

SUPPORTED = supported_apis({ApiKey.INIT_PRODUCER_ID: (0, 5), ApiKey.API_VERSIONS: (0, 4)})
optional = st.sampled_from([-1, -1, -1, 0, 7])  # none given, mostly


@st.composite
def init_frames(draw: st.DrawFn) -> bytes:
    """An InitProducerId frame as any client may send it (without its length prefix)."""
    version = draw(st.integers(0, 5))
    body = requests.init_producer_id(
        draw(st.none() | st.none() | st.text(max_size=10)),
        draw(int32s),
        producer_id=draw(optional),
        producer_epoch=draw(optional),
        version=version,
    )
    return encode_request(body, draw(int32s), draw(client_ids))[4:]


def _kio_reads_it_so(frame: bytes, read: tuple[int, int]) -> None:
    request = decode_request(frame, SUPPORTED)
    body = request.body
    assert (request.api_key, request.api_version) == (ApiKey.INIT_PRODUCER_ID, read[0])
    assert request.header.correlation_id == read[1]
    assert body.transactional_id is None
    assert (getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1)) == (-1, -1)


@given(init_frames())
def test_every_idempotent_request_without_producer_id_is_read_and_no_other(frame: bytes) -> None:
    request = decode_request(frame, SUPPORTED)
    body = request.body
    idempotent = body.transactional_id is None and (
        getattr(body, "producer_id", -1),
        getattr(body, "producer_epoch", -1),
    ) == (-1, -1)
    read = read_idempotent_init(frame, SERVED)
    if idempotent:
        assert read == (request.api_version, request.header.correlation_id)
    else:
        assert read is None


@given(init_frames(), st.data())
def test_a_damaged_frame_is_read_only_as_kio_reads_it(frame: bytes, data: st.DataObject) -> None:
    """Truncated, extended or with a byte changed: whatever the struct reader accepts, kio
    reads as the same idempotent request (what it leaves, kio reads or refuses)."""
    read_only_as_kio_reads(
        damaged(frame, data), lambda f: read_idempotent_init(f, SERVED), _kio_reads_it_so, SUPPORTED
    )


def test_versions_not_served_and_other_apis_are_left_alone() -> None:
    frame = encode_request(requests.init_producer_id(None, version=5), 1, "c")[4:]
    assert read_idempotent_init(frame, shapes(range(5))) is None
    assert read_idempotent_init(frame, SERVED) == (5, 1)
    other = encode_request(requests.api_versions(), 1, "c")[4:]
    assert read_idempotent_init(other, SERVED) is None
    not_utf8 = frame.replace(b"\x00\x01c", b"\x00\x01\xff")
    assert read_idempotent_init(not_utf8, SERVED) == (5, 1)  # any client id (as Kafka)


@given(
    version=st.sampled_from(sorted(VERSIONS)),
    correlation_ids=st.lists(int32s, min_size=1, max_size=5),
    producer_ids=st.lists(st.integers(0, 2**63 - 2), max_size=5),
    error=st.sampled_from(
        [ErrorCode.coordinator_load_in_progress, ErrorCode.cluster_authorization_failed]
    ),
)
def test_a_runs_answers_are_kios_bytes(
    version: int, correlation_ids: list[int], producer_ids: list[int], error: ErrorCode
) -> None:
    producer_ids = producer_ids[: len(correlation_ids)]
    cls: Any = response_class(ApiKey.INIT_PRODUCER_ID, version)
    expected = []
    for i, correlation_id in enumerate(correlation_ids):
        granted = i < len(producer_ids)
        body = cls(
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.none if granted else error,
            producer_id=i64(producer_ids[i] if granted else -1),
            producer_epoch=i16(0 if granted else -1),
        )
        header = RequestHeader(ApiKey.INIT_PRODUCER_ID, version, correlation_id, "c", 2)
        expected.append(kio_encoded(header, body))
    assert answer_run(version, correlation_ids, producer_ids, error) == expected
