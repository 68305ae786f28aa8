"""Requests and responses as typed kio entities, to and from frames.

Server side: :func:`decode_request` and :func:`encode_response`. Client side:
:func:`encode_request` and :func:`decode_response`. Errors are split the way Kafka's socket
server splits them: an ApiVersions request at an unknown version gets an answer
(:class:`UnsupportedApiVersionsVersion`); anything else that cannot be parsed closes the
connection (:class:`ProtocolViolation`).
"""

from __future__ import annotations

import datetime
import io
import operator
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

from kio._kio_native import read_compact_array_length, read_legacy_array_length
from kio.serial import entity_reader, entity_writer
from kio.static.protocol import RequestPayload, ResponsePayload

from pidctl.protocol.apis import (
    ApiKey,
    SupportedApis,
    request_class,
    request_header_version,
    response_class,
    response_header_version,
)
from pidctl.protocol.headers import (
    RequestHeader,
    parse_request_header,
    skip_response_header,
    write_request_header,
    write_response_header,
)


class ProtocolViolation(Exception):
    """The request cannot be served; Kafka closes the connection in this case."""


class UnknownApiKey(ProtocolViolation):
    """The API key is not one this server serves."""


class UnsupportedVersion(ProtocolViolation):
    """The API is served, but not at this version (and it is not ApiVersions)."""


class MalformedRequest(ProtocolViolation):
    """The header or body does not parse (bytes after the body are ignored, as in Kafka).

    This includes tagged fields kio does not know: kio refuses them where Kafka would skip
    them (none of the request versions pidctl serves defines any the clients send)."""


class TooManyEntries(Exception):
    """A request's array (FindCoordinator's keys, Metadata's topics) is longer than its
    limit: found from the array's length prefix, before any of it is decoded. Kafka has no
    such limit; pidctl answers it with the error the API defines for a bad request
    (``INVALID_REQUEST``), built from the header alone."""

    def __init__(self, header: RequestHeader, entries: int, limit: int) -> None:
        super().__init__(
            f"API key {header.api_key} v{header.api_version}: {entries} entries, at most {limit}"
        )
        self.header = header
        self.entries = entries
        self.limit = limit


class UnsupportedApiVersionsVersion(Exception):
    """An ApiVersions request at a version we do not know: answer with UNSUPPORTED_VERSION
    in the v0 layout so the client can retry at a version we list."""

    def __init__(self, header: RequestHeader) -> None:
        super().__init__(f"ApiVersions v{header.api_version} is not supported")
        self.header = header


class Request(NamedTuple):
    """A decoded request: its header and its kio body entity."""

    header: RequestHeader
    body: Any  # a kio RequestPayload; Any so handlers can narrow it with isinstance
    #: Entries of the array the request's work grows with (:data:`ENTRY_ARRAYS`), 0 for
    #: requests without one: what the request costs beyond its own, in a round's budget.
    entries: int = 0

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def api_version(self) -> int:
        return self.header.api_version


#: The requests whose work grows with one array, and where that array begins: API key →
#: (first version that has it, bytes of the body before it). Metadata's topics are its first
#: field in every version; FindCoordinator's keys (v4+) follow its key type (an int8).
ENTRY_ARRAYS: Final[dict[int, tuple[int, int]]] = {
    ApiKey.METADATA: (0, 0),
    ApiKey.FIND_COORDINATOR: (4, 1),
}


def count_entries(frame: bytes, body_offset: int, api_key: int, api_version: int) -> int:
    """The length prefix of the request's array in :data:`ENTRY_ARRAYS`, read without
    decoding the array: 0 for other requests, a null array, or a frame too short to say
    (its decoding then fails as it would anyway)."""
    where = ENTRY_ARRAYS.get(api_key)
    if where is None or api_version < where[0]:
        return 0
    offset = body_offset + where[1]
    if request_class(api_key, api_version).__flexible__:
        read = read_compact_array_length
    else:
        read = read_legacy_array_length
    try:
        length, _ = read(frame, offset)
    except Exception:  # a truncated prefix: decoding says what is wrong
        return 0
    return 0 if length is None or length < 0 else int(length)


def decode_request(
    frame: bytes, supported: SupportedApis, max_entries: Mapping[int, int] | None = None
) -> Request:
    """Decode one request frame (without its length prefix).

    Raises :class:`UnsupportedApiVersionsVersion` for an ApiVersions request at an unknown
    version, :class:`TooManyEntries` for a request whose array (:data:`ENTRY_ARRAYS`) is
    longer than ``max_entries`` allows its API (checked before the array is decoded), and a
    :class:`ProtocolViolation` for anything the server must close on.
    """
    if len(frame) < _API.size:
        raise MalformedRequest(f"frame of {len(frame)} bytes has no request header")
    api_key, api_version = _API.unpack_from(frame)
    versions = supported.get(api_key)
    if versions is None:
        raise UnknownApiKey(f"unknown API key {api_key}")
    if not versions.min <= api_version <= versions.max:
        if api_key == ApiKey.API_VERSIONS and api_version >= 0:
            raise UnsupportedApiVersionsVersion(_parse_header(frame, api_key, api_version)[0])
        raise UnsupportedVersion(
            f"API key {api_key} version {api_version} is not supported "
            f"(supported {versions.min}-{versions.max})"
        )
    layout = _LAYOUTS.get((api_key, api_version)) or _layout(api_key, api_version)
    try:
        header, offset = parse_request_header(frame, layout[0])
    except Exception as e:
        raise MalformedRequest(f"API key {api_key} v{api_version}: bad header ({e})") from e
    entries = 0
    if api_key in ENTRY_ARRAYS:
        entries = count_entries(frame, offset, api_key, api_version)
        if entries and max_entries is not None:
            limit = max_entries.get(api_key)
            if limit is not None and entries > limit:
                raise TooManyEntries(header, entries, limit)
    try:
        body = layout[1](frame, offset)[0]
    except Exception as e:
        raise MalformedRequest(
            f"API key {api_key} v{api_version}: body does not parse ({e})"
        ) from e
    # Bytes after the body are ignored, as Kafka ignores them (RequestContext.parseRequest
    # reads the body and never looks at what the buffer has left).
    return Request(header, body, entries)


def _parse_header(frame: bytes, api_key: int, api_version: int) -> tuple[RequestHeader, int]:
    try:
        return parse_request_header(frame, request_header_version(api_key, api_version))
    except Exception as e:
        raise MalformedRequest(f"API key {api_key} v{api_version}: bad header ({e})") from e


#: The start of every request frame: API key, API version.
_API: Final = struct.Struct(">hh")
#: (API key, version) -> the request's header version and its body's kio reader.
_LAYOUTS: Final[dict[tuple[int, int], tuple[int, Callable[[bytes, int], Any]]]] = {}


def _layout(api_key: int, api_version: int) -> tuple[int, Callable[[bytes, int], Any]]:
    """A request's header version and its body's kio reader, looked up once per version
    (only for versions a server supports: the table stays small)."""
    layout = _LAYOUTS[api_key, api_version] = (
        request_header_version(api_key, api_version),
        entity_reader(request_class(api_key, api_version)),
    )
    return layout


_LENGTH: Final = struct.Struct(">i")

# Precompiled answers of the hot APIs (every producer's InitProducerId, every broker's
# AllocateProducerIds): one struct.pack instead of kio's generic, field-by-field writer.
# (ApiVersions, every connection's first request, is built and encoded once by the server's
# response building, controller/api/responses.py, and framed by frame_response.)
# Length, correlation id, [tagged fields of a v1 header], the body, [its tagged fields]; the
# tests check them byte for byte against kio's encoders.
INIT_PRODUCER_ID_ANSWER_V0: Final = struct.Struct(">iiihqh")  # v0-v1: not flexible
INIT_PRODUCER_ID_ANSWER_V2: Final = struct.Struct(">iiBihqhB")  # v2+: flexible, no tagged fields
ALLOCATE_PRODUCER_IDS_ANSWER_V0: Final = struct.Struct(">iiBihqiB")  # flexible, no tagged fields


def _millis(throttle: datetime.timedelta) -> int:
    if not throttle:
        return 0  # (nearly every answer: asked on each)
    return round(throttle.total_seconds() * 1000)  # as kio writes an i32 timedelta


_INIT_V0_PACK: Final = INIT_PRODUCER_ID_ANSWER_V0.pack
_INIT_V0_SIZE: Final = INIT_PRODUCER_ID_ANSWER_V0.size - 4
_INIT_V2_PACK: Final = INIT_PRODUCER_ID_ANSWER_V2.pack
_INIT_V2_SIZE: Final = INIT_PRODUCER_ID_ANSWER_V2.size - 4
_ALLOCATE_PACK: Final = ALLOCATE_PRODUCER_IDS_ANSWER_V0.pack
_ALLOCATE_SIZE: Final = ALLOCATE_PRODUCER_IDS_ANSWER_V0.size - 4


def init_producer_id_answer(
    version: int,
    correlation_id: int,
    error: int,
    producer_id: int,
    producer_epoch: int,
    throttle_ms: int = 0,
) -> bytes:
    """The frame answering an InitProducerId at ``version`` (the producer id and epoch -1
    with an error), packed at once: what the server sends for a request kio read (its
    response entity's fields) and for one read by ``struct`` alike."""
    if version >= 2:
        return _INIT_V2_PACK(
            _INIT_V2_SIZE, correlation_id, 0, throttle_ms, error, producer_id, producer_epoch, 0
        )
    return _INIT_V0_PACK(
        _INIT_V0_SIZE, correlation_id, throttle_ms, error, producer_id, producer_epoch
    )


def allocate_producer_ids_answer(
    correlation_id: int, error: int, first: int, length: int, throttle_ms: int = 0
) -> bytes:
    """The frame answering an AllocateProducerIds (v0, the only version): the block
    (``first``, ``length``; 0, 0 with an error), packed at once, as
    :func:`init_producer_id_answer`."""
    return _ALLOCATE_PACK(_ALLOCATE_SIZE, correlation_id, 0, throttle_ms, error, first, length, 0)


def _init_producer_id(correlation_id: int, body: Any) -> bytes:
    return init_producer_id_answer(
        body.__version__,
        correlation_id,
        body.error_code,
        body.producer_id,
        body.producer_epoch,
        _millis(body.throttle_time),
    )


def _allocate_producer_ids(correlation_id: int, body: Any) -> bytes:
    return allocate_producer_ids_answer(
        correlation_id,
        body.error_code,
        body.producer_id_start,
        body.producer_id_len,
        _millis(body.throttle_time),
    )


def _uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (the lengths of compact strings and arrays)."""
    if value < 0x80:
        return _BYTES[value]
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_BYTES: Final = [bytes([b]) for b in range(256)]
_COORDINATOR_TAIL: Final = struct.Struct(">ih")  # port, error code
_coordinator_shape: Final = operator.attrgetter(
    "node_id", "host", "port", "error_code", "error_message"
)


def _compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\0"
    data = text.encode()
    return _uvarint(len(data) + 1) + data


def _find_coordinator_v4(correlation_id: int, body: Any) -> bytes:
    """FindCoordinator v4+ (a list of keys, KIP-699): every entry packed here rather than
    field by field by kio's generic writer, a twelfth of its time; an answer to 1,000 keys
    is the costliest any request gets within the default bounds."""
    parts = [_INT32.pack(correlation_id), b"\0"]  # header v1: correlation id, tagged fields
    parts.append(_INT32.pack(_millis(body.throttle_time)))
    coordinators = body.coordinators
    parts.append(_uvarint(len(coordinators) + 1))
    encoded: dict[tuple[Any, ...], bytes] = {}
    append = parts.append
    for entry in coordinators:
        # Entries differ by key; what follows it is the same for most: encoded once.
        shape = _coordinator_shape(entry)
        rest = encoded.get(shape)
        if rest is None:
            node_id, host, port, error_code, error_message = shape
            rest = encoded[shape] = (
                _INT32.pack(node_id)
                + _compact_string(host)
                + _COORDINATOR_TAIL.pack(port, error_code)
                + _compact_string(error_message)
                + b"\0"  # the entry's tagged fields
            )
        key = entry.key.encode()
        append(_BYTES[len(key) + 1] if len(key) < 0x7F else _uvarint(len(key) + 1))
        append(key)
        append(rest)
    parts.append(b"\0")  # the body's tagged fields
    data = b"".join(parts)
    return _INT32.pack(len(data)) + data


_INT32: Final = struct.Struct(">i")


_RESPONSE_HEADER_V0: Final = struct.Struct(">ii")  # length, correlation id


def encode_response_body(body: ResponsePayload) -> bytes:
    """A response body's bytes alone, by kio's writer: for an answer built and encoded once
    and sent to many (ApiVersions), which :func:`frame_response` frames for each request."""
    buffer = io.BytesIO()
    entity_writer(type(body))(buffer, body)
    return buffer.getvalue()


def frame_response(header: RequestHeader, body: ResponsePayload, encoded_body: bytes) -> bytes:
    """The frame of the response to ``header``'s request whose body ``encoded_body`` holds
    (:func:`encode_response_body` of ``body``): the same bytes as :func:`encode_response`
    gives, with only the header packed per answer."""
    version = response_header_version(body.__api_key__, body.__version__)
    if version == 0:  # (ApiVersions at every version, KIP-511: any client can read it)
        return _RESPONSE_HEADER_V0.pack(len(encoded_body) + 4, header.correlation_id) + (
            encoded_body
        )
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_response_header(buffer, version, header.correlation_id)
    buffer.write(encoded_body)
    data = buffer.getbuffer()
    _LENGTH.pack_into(data, 0, len(data) - 4)
    return bytes(data)


PRECOMPILED_RESPONSES: Final[dict[tuple[int, int], Callable[[int, Any], bytes]]] = {
    **{(ApiKey.INIT_PRODUCER_ID, v): _init_producer_id for v in range(6)},
    (ApiKey.ALLOCATE_PRODUCER_IDS, 0): _allocate_producer_ids,
    **{(ApiKey.FIND_COORDINATOR, v): _find_coordinator_v4 for v in range(4, 7)},
}


def encode_response(header: RequestHeader, body: ResponsePayload) -> bytes:
    """Encode a response to ``header``'s request as a length-prefixed frame.

    The response header version follows the body's own API version, so the ApiVersions
    fallback (a v0 body for a request of another version) gets the v0 header it needs.
    InitProducerId and AllocateProducerIds answers are packed by precompiled structs.
    """
    precompiled = PRECOMPILED_RESPONSES.get((body.__api_key__, body.__version__))
    if precompiled is not None:
        return precompiled(header.correlation_id, body)
    return encode_response_generic(header, body)


def encode_response_generic(header: RequestHeader, body: ResponsePayload) -> bytes:
    """:func:`encode_response` by kio's generic writer alone (the reference of the
    precompiled ones)."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_response_header(
        buffer,
        response_header_version(body.__api_key__, body.__version__),
        header.correlation_id,
    )
    entity_writer(type(body))(buffer, body)
    data = buffer.getbuffer()
    _LENGTH.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def encode_request(body: RequestPayload, correlation_id: int, client_id: str | None) -> bytes:
    """Encode a request (what a client sends) as a length-prefixed frame."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    api_key, api_version = body.__api_key__, body.__version__
    write_request_header(
        buffer,
        request_header_version(api_key, api_version),
        api_key,
        api_version,
        correlation_id,
        client_id,
    )
    entity_writer(type(body))(buffer, body)
    data = buffer.getbuffer()
    _LENGTH.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def encode_request_prefix(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body_size: int
) -> bytes:
    """The length prefix and header of a request whose ``body_size`` bytes of body the
    caller encodes and writes after them (a Produce request's record batches, sent from
    their own buffers rather than copied into one frame)."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_request_header(
        buffer,
        request_header_version(api_key, api_version),
        api_key,
        api_version,
        correlation_id,
        client_id,
    )
    data = buffer.getbuffer()
    _LENGTH.pack_into(data, 0, len(data) - 4 + body_size)
    return bytes(data)


def peek_correlation_id(frame: bytes) -> int:
    """The correlation id of a response frame: the first field of every header version."""
    return skip_response_header(frame, 0)[0]


def decode_response(frame: bytes, api_key: int, api_version: int) -> Any:
    """Decode a response frame (without its length prefix) to the kio entity for the API.

    Raises ``kio.serial.errors.DecodeError`` when the bytes do not parse.
    """
    _, offset = skip_response_header(frame, response_header_version(api_key, api_version))
    body, _ = entity_reader(response_class(api_key, api_version))(frame, offset)
    return body
