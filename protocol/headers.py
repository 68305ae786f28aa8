"""Request header v0/v1/v2 parsing and response header v0/v1 encoding."""

from __future__ import annotations

import io
import struct
from typing import Final, NamedTuple

from kio._kio_native import read_int16, read_int32
from kio.schema.request_header.v1 import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0 import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1 import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import DecodeError
from kio.serial.readers import read_unsigned_varint
from kio.static.primitive import i16, i32

_read_v1: Final = entity_reader(RequestHeaderV1)
_read_v2: Final = entity_reader(RequestHeaderV2)
_write_request_v1: Final = entity_writer(RequestHeaderV1)
_write_request_v2: Final = entity_writer(RequestHeaderV2)
_write_response_v0: Final = entity_writer(ResponseHeaderV0)
_write_response_v1: Final = entity_writer(ResponseHeaderV1)


class RequestHeader(NamedTuple):
    """The fields every request header version shares; ``client_id`` is None in v0."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    version: int


def peek_api(frame: bytes) -> tuple[int, int]:
    """Read ``(api_key, api_version)`` from the start of a request frame.

    Raises ``kio.serial.errors.BufferUnderflow`` (a ``DecodeError``) on a frame too short.
    """
    api_key, _ = read_int16(frame, 0)
    api_version, _ = read_int16(frame, 2)
    return api_key, api_version


#: The start of a v1 or v2 request header: API key, API version, correlation id, and the
#: client id's length (a nullable legacy string in both versions: -1 for null).
REQUEST_HEADER_START: Final = struct.Struct(">hhih")


def utf8_string(raw: bytes) -> str | None:
    """``raw`` as kio reads a string (strict UTF-8; ASCII, what clients send, first and
    cheaply), or None where kio refuses the request: what a ``struct`` reader makes of a
    string it accepts."""
    if raw.isascii():
        return raw.decode("ascii")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def client_id_of(raw: bytes) -> str:
    """A request header's client id as Kafka reads it: UTF-8, with each sequence that is not
    UTF-8 replaced by U+FFFD, as Java's ``new String(bytes, UTF_8)`` does. Kafka answers a
    request whatever bytes its client id holds (checked against Kafka 4.4.0: the
    conformance case ``header-client-id-not-utf8``), so pidctl does too. Two ids that differ
    only in such bytes read as one, as in Kafka: a quota per client id is theirs alike, and
    a job key, which must name one app, refuses U+FFFD (``controller/core/jobs.py``)."""
    if raw.isascii():
        return raw.decode("ascii")
    return raw.decode("utf-8", "replace")


def client_id_in(frame: bytes) -> str | None:
    """The client id of a request ``frame`` whose v1/v2 header a ``struct`` reader has
    already read (its length is known good): for the runs, which read it only when asked."""
    length = REQUEST_HEADER_START.unpack_from(frame)[3]
    if length < 0:
        return None
    return client_id_of(frame[REQUEST_HEADER_START.size : REQUEST_HEADER_START.size + length])


def parse_request_header(frame: bytes, version: int) -> tuple[RequestHeader, int]:
    """Parse a request header of the given version; return it and the offset of the body.

    Raises ``kio.serial.errors.DecodeError`` on malformed input.
    """
    if version == 1 or version == 2:
        usual = _parse_usual_header(frame, version)
        if usual is not None:
            return usual
    return _parse_with_kio(frame, version)


def _parse_usual_header(frame: bytes, version: int) -> tuple[RequestHeader, int] | None:
    """The header every client sends, read without kio's header entity (an object of its
    own per request): v1 or v2, a client id (:func:`client_id_of`) or none, and for v2 its
    tagged fields skipped. None for a frame shorter than a header, or a client id's length
    that is negative (but -1) or runs past the frame, which :func:`_parse_with_kio` then
    refuses. The tests check it reads what kio reads, but for the client ids and tagged
    fields kio refuses and Kafka does not."""
    if len(frame) < REQUEST_HEADER_START.size:
        return None
    api_key, api_version, correlation_id, length = REQUEST_HEADER_START.unpack_from(frame)
    start = REQUEST_HEADER_START.size
    if length == -1:
        client_id = None
        end = start
    else:
        end = start + length
        if length < 0 or end > len(frame):
            return None
        client_id = client_id_of(frame[start:end])
    if version == 2:
        after = _after_tagged_fields(frame, end)
        if after is None:  # (kio would say it knows no such tag: the fault is elsewhere)
            raise DecodeError("request header: tagged fields past the end of the frame")
        end = after
    return RequestHeader(api_key, api_version, correlation_id, client_id, version), end


def _after_tagged_fields(frame: bytes, at: int) -> int | None:
    """Where a v2 header's tagged fields end. A request header has no tag Kafka knows, and
    Kafka skips the tags it does not know (checked against Kafka 4.4.0: the conformance
    case ``header-tagged-fields``), where kio refuses them. None if they run past the frame.
    Each field takes two bytes at least, so a count however large ends with the frame."""
    if at < len(frame) and frame[at] == 0:
        return at + 1  # none: what every client sends
    try:
        count, read = read_unsigned_varint(frame, at)  # (kio's readers say bytes read)
        at += read
        for _ in range(count):
            _, read = read_unsigned_varint(frame, at)  # the tag
            at += read
            size, read = read_unsigned_varint(frame, at)
            at += read + size
    except (DecodeError, ValueError):  # (ValueError: a varint of more than five bytes)
        return None
    return at if at <= len(frame) else None


def _parse_with_kio(frame: bytes, version: int) -> tuple[RequestHeader, int]:
    if version == 0:
        # kio has no entity for v0 (api key, api version, correlation id only).
        api_key, _ = read_int16(frame, 0)
        api_version, _ = read_int16(frame, 2)
        correlation_id, _ = read_int32(frame, 4)
        return RequestHeader(api_key, api_version, correlation_id, None, 0), 8
    if version == 1:
        header_v1, offset = _read_v1(frame, 0)
        return _common(header_v1, 1), offset
    if version == 2:
        header_v2, offset = _read_v2(frame, 0)
        return _common(header_v2, 2), offset
    raise ValueError(f"unknown request header version {version}")


def _common(header: RequestHeaderV1 | RequestHeaderV2, version: int) -> RequestHeader:
    return RequestHeader(
        header.request_api_key,
        header.request_api_version,
        header.correlation_id,
        header.client_id,
        version,
    )


def write_request_header(
    buffer: io.BytesIO,
    version: int,
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
) -> None:
    """Write a v1 or v2 request header (what clients send)."""
    key, ver, corr = i16(api_key), i16(api_version), i32(correlation_id)
    if version == 2:
        _write_request_v2(
            buffer,
            RequestHeaderV2(
                request_api_key=key,
                request_api_version=ver,
                correlation_id=corr,
                client_id=client_id,
            ),
        )
    elif version == 1:
        _write_request_v1(
            buffer,
            RequestHeaderV1(
                request_api_key=key,
                request_api_version=ver,
                correlation_id=corr,
                client_id=client_id,
            ),
        )
    else:
        raise ValueError(f"clients do not send request header version {version}")


def write_response_header(buffer: io.BytesIO, version: int, correlation_id: int) -> None:
    """Write a v0 or v1 response header."""
    if version == 1:
        _write_response_v1(buffer, ResponseHeaderV1(correlation_id=i32(correlation_id)))
    elif version == 0:
        _write_response_v0(buffer, ResponseHeaderV0(correlation_id=i32(correlation_id)))
    else:
        raise ValueError(f"unknown response header version {version}")


def skip_response_header(frame: bytes, version: int) -> tuple[int, int]:
    """Read a response header; return ``(correlation_id, offset of the body)``."""
    if version == 1:
        header_v1, offset = entity_reader(ResponseHeaderV1)(frame, 0)
        return header_v1.correlation_id, offset
    correlation_id, offset = read_int32(frame, 0)
    return correlation_id, offset
