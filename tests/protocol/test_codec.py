from __future__ import annotations

import contextlib
import datetime
import io
import struct
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsResponse
from kio.schema.api_versions.v0 import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v3 import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId
from kio.serial.errors import DecodeError, InvalidUnicode
from kio.static.primitive import i32, i32Timedelta

from pidctl.controller.api.handlers import SERVED_APIS
from pidctl.protocol import headers
from pidctl.protocol.api_versions import (
    build_api_versions_response,
    has_valid_client_software,
    unsupported_version_response,
)
from pidctl.protocol.apis import (
    ApiKey,
    request_class,
    request_header_version,
    response_header_version,
    supported_apis,
)
from pidctl.protocol.codec import (
    MalformedRequest,
    UnknownApiKey,
    UnsupportedApiVersionsVersion,
    UnsupportedVersion,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from pidctl.protocol.headers import RequestHeader, parse_request_header, write_request_header
from tests import wire

SUPPORTED = supported_apis(SERVED_APIS)


def _body(frame: bytes) -> bytes:
    return frame[4:]


def test_header_versions_follow_flexibility() -> None:
    assert request_header_version(ApiKey.API_VERSIONS, 0) == 1
    assert request_header_version(ApiKey.API_VERSIONS, 3) == 2
    assert request_header_version(ApiKey.API_VERSIONS, 99) == 2
    assert request_header_version(ApiKey.ALLOCATE_PRODUCER_IDS, 0) == 2
    assert request_header_version(ApiKey.CONTROLLED_SHUTDOWN, 0) == 0
    assert request_header_version(ApiKey.METADATA, 8) == 1
    assert request_header_version(ApiKey.METADATA, 9) == 2
    # ApiVersions answers always use header v0, even at flexible versions.
    assert response_header_version(ApiKey.API_VERSIONS, 4) == 0
    assert response_header_version(ApiKey.ALLOCATE_PRODUCER_IDS, 0) == 1
    assert response_header_version(ApiKey.METADATA, 8) == 0


def test_request_header_v0_parses() -> None:
    frame = bytes.fromhex("0007 0000 0000002a") + b"body"
    header, offset = parse_request_header(frame, 0)
    assert (header.api_key, header.api_version, header.correlation_id) == (7, 0, 42)
    assert header.client_id is None and offset == 8


@pytest.mark.parametrize("version", [1, 2])
@given(correlation_id=st.integers(0, 2**31 - 1), client_id=st.none() | st.text(max_size=40))
def test_request_header_round_trip(
    version: int, correlation_id: int, client_id: str | None
) -> None:
    buffer = io.BytesIO()
    write_request_header(buffer, version, 67, 0, correlation_id, client_id)
    header, offset = parse_request_header(buffer.getvalue(), version)
    assert (header.correlation_id, header.client_id, offset) == (
        correlation_id,
        client_id,
        len(buffer.getvalue()),
    )


_I16 = st.integers(min_value=-(2**15), max_value=2**15 - 1)
_I32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@st.composite
def _request_header_frames(draw: st.DrawFn, version: int) -> bytes:
    """Request frames whose header is well formed or nearly so: a text, null or non-UTF-8
    client id under its own length or a drawn one (negative, past the end), for v2 no tagged
    fields or any bytes there; now and then any bytes at all."""
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        return draw(st.binary(max_size=40))
    start = struct.pack(">hhi", draw(_I16), draw(_I16), draw(_I32))
    client_id = draw(st.none() | st.text(max_size=20) | st.binary(max_size=20))
    if client_id is None:
        encoded, length = b"", -1
    else:
        encoded = client_id.encode() if isinstance(client_id, str) else client_id
        length = len(encoded)
    length = draw(st.just(length) | st.integers(min_value=-3, max_value=length + 3) | _I16)
    tagged = draw(st.just(b"\0") | st.binary(max_size=6)) if version == 2 else b""
    return start + struct.pack(">h", length) + encoded + tagged + draw(st.binary(max_size=6))


def _read_or_refused(read: Callable[[bytes, int], object], frame: bytes, version: int) -> object:
    try:
        return read(frame, version)
    except Exception as e:
        return type(e)


@pytest.mark.parametrize("version", [1, 2])
@given(data=st.data())
def test_the_usual_header_is_read_as_kio_reads_it(version: int, data: st.DataObject) -> None:
    # The struct reading of a v1/v2 header gives what kio's reader gives, or leaves the
    # frame to it (which then reads it or refuses it as before); but a client id that is not
    # UTF-8, which kio refuses, is read as Kafka reads it (headers.client_id_of).
    frame = data.draw(_request_header_frames(version))
    got = _read_or_refused(parse_request_header, frame, version)
    if version == 2 and isinstance(got, tuple):
        # Tagged fields, which kio refuses and Kafka skips: kio's reading of the frame with
        # none in their place (their end is test_header_tagged_fields_are_skipped's).
        (length,) = struct.unpack_from(">h", frame, 8)
        tags_at = 10 + max(0, length)
        frame = frame[:tags_at] + b"\0" + frame[got[1] :]
        got = (got[0], tags_at + 1)
    expected = _read_or_refused(headers._parse_with_kio, frame, version)
    if expected is InvalidUnicode:
        # What kio reads with as many ASCII bytes in the client id's place, with Kafka's
        # reading of the client id; or a refusal still, when kio refuses that too.
        (length,) = struct.unpack_from(">h", frame, 8)
        raw = frame[10 : 10 + length]
        placeheld = frame[:10] + b"?" * length + frame[10 + length :]
        read = _read_or_refused(headers._parse_with_kio, placeheld, version)
        if isinstance(read, tuple):
            header, offset = read
            expected = (header._replace(client_id=headers.client_id_of(raw)), offset)
        else:
            assert isinstance(got, type)
            return
    if isinstance(expected, type):  # refused (kio's error or ours: the connection closes)
        assert isinstance(got, type), got
        return
    assert got == expected


@pytest.mark.parametrize(
    ("tags", "read"),
    [
        (b"\0", True),
        (b"\x01\x07\x02hi", True),  # tag 7: two bytes
        (b"\x02\x07\x00\xac\x02\x01!", True),  # tag 7 empty, tag 300 (a 2-byte varint): one
        (b"\x01\x07\x05hi", False),  # five bytes said, two there
        (b"\x02\x07\x00", False),  # a second field missing
        (b"\x81", False),  # a count's varint cut short
    ],
)
def test_header_tagged_fields_are_skipped(tags: bytes, read: bool) -> None:
    """A request header has no tag Kafka knows; Kafka skips the ones it does not (Kafka
    4.4.0 answers such a request: the conformance case ``header-tagged-fields``), so pidctl
    does too; fields that run past the frame are refused as malformed."""
    buffer = io.BytesIO()
    write_request_header(buffer, 2, 22, 5, 42, "c")
    start = buffer.getvalue()[:-1]  # without its "no tags" byte
    if not read:
        with pytest.raises(DecodeError):
            parse_request_header(start + tags, 2)
        return
    header, offset = parse_request_header(start + tags + b"body", 2)
    assert (header.api_key, header.api_version, header.correlation_id) == (22, 5, 42)
    assert (header.client_id, offset) == ("c", len(start) + len(tags))


@pytest.mark.parametrize("version", [1, 2])
def test_a_client_id_that_is_not_utf8_is_read_as_kafka_reads_it(version: int) -> None:
    """Java's ``new String(bytes, UTF_8)``: each sequence that is not UTF-8 becomes U+FFFD,
    and the request is read (Kafka 4.4.0 answers it: the conformance case
    ``header-client-id-not-utf8``)."""
    buffer = io.BytesIO()
    write_request_header(buffer, version, 22, 5, 42, "caf?-?")
    frame = buffer.getvalue().replace(b"caf?-?", b"caf\xe9-\xff") + b"body"
    header, offset = parse_request_header(frame, version)
    assert header.client_id == "caf\ufffd-\ufffd"
    assert frame[offset:] == b"body"


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("client_id", [None, "", "rdkafka", "pr\u00f6ducer-\u4e00"])
def test_the_usual_header_takes_the_struct_reading(version: int, client_id: str | None) -> None:
    # What clients send is read without kio's entity (the point of the fast reading), and
    # read the same.
    buffer = io.BytesIO()
    write_request_header(buffer, version, 22, 5, 42, client_id)
    frame = buffer.getvalue() + b"body"
    usual = headers._parse_usual_header(frame, version)
    assert usual is not None
    assert usual == headers._parse_with_kio(frame, version)
    assert usual == (RequestHeader(22, 5, 42, client_id, version), len(frame) - 4)


@pytest.mark.parametrize(
    "body",
    [
        wire.allocate(3, 17),
        wire.registration(3, "cluster", uuid.uuid4()),
        wire.heartbeat(3, 17, want_fence=True),
        wire.unregister(3),
        ApiVersionsRequestV0(),
        ApiVersionsRequestV3(client_software_name="pidctl", client_software_version="1.0"),
    ],
)
def test_requests_round_trip(body: object) -> None:
    frame = encode_request(body, 12345, "client-1")  # type: ignore[arg-type]
    request = decode_request(_body(frame), SUPPORTED)
    assert request.body == body
    assert request.header.correlation_id == 12345
    assert request.header.client_id == "client-1"


@pytest.mark.parametrize("key", sorted(SERVED_APIS))
def test_every_served_version_has_kio_entities(key: ApiKey) -> None:
    lo, hi = SERVED_APIS[key]
    for version in range(lo, hi + 1):
        assert request_class(key, version).__version__ == version


def test_unknown_api_key_is_a_violation() -> None:
    frame = bytes.fromhex("0000 0000 00000001 0000")  # Produce: not served
    with pytest.raises(UnknownApiKey):
        decode_request(frame, SUPPORTED)


def test_unsupported_version_of_a_served_api_is_a_violation() -> None:
    frame = encode_request(wire.allocate(1, 1), 1, "c")
    data = bytearray(_body(frame))
    data[2:4] = (5).to_bytes(2, "big")
    with pytest.raises(UnsupportedVersion):
        decode_request(bytes(data), SUPPORTED)


def test_future_api_versions_request_gets_v0_fallback() -> None:
    frame = encode_request(
        ApiVersionsRequestV3(client_software_name="x", client_software_version="1"), 99, "c"
    )
    data = bytearray(_body(frame))
    data[2:4] = (42).to_bytes(2, "big")  # ApiVersions v42
    with pytest.raises(UnsupportedApiVersionsVersion) as info:
        decode_request(bytes(data), SUPPORTED)
    out = encode_response(info.value.header, unsupported_version_response(SUPPORTED))
    response = decode_response(_body(out), ApiKey.API_VERSIONS, 0)
    assert response.error_code == ErrorCode.unsupported_version
    listed = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert listed == {ApiKey.API_VERSIONS: (0, 4)}  # its own range only, as Kafka (KIP-511)
    assert int.from_bytes(out[4:8], "big") == 99  # correlation id in a v0 header


@pytest.mark.parametrize("cut", [0, 1, 3, 6, 9])
def test_truncated_request_is_malformed(cut: int) -> None:
    frame = _body(encode_request(wire.registration(1, "cluster-id"), 7, "client"))
    with pytest.raises(MalformedRequest):
        decode_request(frame[:cut] if cut < 4 else frame[: len(frame) - cut], SUPPORTED)


@pytest.mark.parametrize("trailing", [b"\0", b"\0\0\0\0junk"])
def test_trailing_bytes_are_ignored_as_kafka_ignores_them(trailing: bytes) -> None:
    frame = _body(encode_request(wire.allocate(1, 1), 7, "client"))
    assert decode_request(frame + trailing, SUPPORTED) == decode_request(frame, SUPPORTED)


@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    with contextlib.suppress(
        MalformedRequest, UnknownApiKey, UnsupportedVersion, UnsupportedApiVersionsVersion
    ):
        decode_request(data, SUPPORTED)


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_response_every_version(version: int) -> None:
    body = build_api_versions_response(version, SUPPORTED)
    request_header = parse_request_header(_body(encode_request(ApiVersionsRequestV0(), 5, "c")), 1)[
        0
    ]
    out = encode_response(request_header, body)
    decoded = decode_response(_body(out), ApiKey.API_VERSIONS, version)
    assert decoded.error_code == ErrorCode.none
    assert {k.api_key for k in decoded.api_keys} == set(SERVED_APIS)
    if version >= 3:
        # No features, above all no finalized transaction.version: a Kafka 4 client then
        # keeps the classic transaction protocol, the one pidctl serves.
        assert decoded.supported_features == decoded.finalized_features == ()
        assert decoded.finalized_features_epoch == -1


def test_client_software_validation() -> None:
    good = ApiVersionsRequestV3(
        client_software_name="apache-kafka-java", client_software_version="3.7.0"
    )
    bad = ApiVersionsRequestV3(client_software_name="-bad", client_software_version="1")
    assert has_valid_client_software(good)
    assert not has_valid_client_software(bad)
    assert has_valid_client_software(ApiVersionsRequestV0())


def test_response_round_trip_keeps_correlation_id() -> None:
    header = decode_request(_body(encode_request(wire.allocate(1, 1), 77, "c")), SUPPORTED).header
    body = AllocateProducerIdsResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none,
        producer_id_start=ProducerId(1000),
        producer_id_len=i32(1000),
    )
    out = encode_response(header, body)
    assert int.from_bytes(out[4:8], "big") == 77
    assert decode_response(_body(out), 67, 0) == body


def test_unknown_tagged_field_is_malformed_not_a_crash() -> None:
    """Found by the live fuzz test: kio raises KeyError for a tagged field it does not know."""
    frame = b"\x00<\x00\x02\x00a\x00\r|\x04f\x11\xffz\xc9\x00\x01\x01\x00"
    with pytest.raises(MalformedRequest):
        decode_request(frame, SUPPORTED)
