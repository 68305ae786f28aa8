"""InitProducerId requests read by ``struct``, one at a time, and the one typed value
every InitProducerId is handed to the controller as (:class:`InitRequested`), whichever
reader read it.

Every transactional producer's start (and each of its restarts) is an InitProducerId
naming its transactional id, and durable: kio's reader builds a header and a body entity
for it field by field. A request in the usual shape (no tagged fields, a transactional id
of at most 126 bytes, so that its compact length is one byte) is read here instead into
the values the decision needs, and the answer is packed by the codec
(``init_producer_id_answer``). Anything else is left to kio's reader, whose request
:func:`init_request_of` turns into the same value: the tests check that both read every
request alike. (Idempotent requests that follow one another are read in a
run: :mod:`protocol.idempotent_inits`.)
"""

from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass
from typing import Final

from pidctl.protocol.apis import ApiKey
from pidctl.protocol.codec import Request
from pidctl.protocol.headers import REQUEST_HEADER_START, client_id_of, utf8_string

#: The API key's low byte (its high byte is 0).
_API_KEY_LOW_BYTE: Final = ApiKey.INIT_PRODUCER_ID & 0xFF
#: The body after the transactional id, per version: the transaction timeout; from v2 (the
#: flexible versions) the body's tagged fields last; from v3 the producer id and epoch.
_REST: Final = {
    0: struct.Struct(">i"),
    1: struct.Struct(">i"),
    2: struct.Struct(">iB"),
    **{version: struct.Struct(">iqhB") for version in (3, 4, 5)},
}
#: Versions this module reads.
VERSIONS: Final = frozenset(_REST)
_LEGACY_LENGTH: Final = struct.Struct(">h")


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class InitRequested:
    """An InitProducerId request, read by ``struct`` or by kio (``producer_id`` and
    ``producer_epoch`` -1 before v3, as kio's defaults)."""

    api_version: Final[int]
    correlation_id: Final[int]
    client_id: Final[str | None]
    transactional_id: Final[str | None]
    timeout_ms: Final[int]
    producer_id: Final[int]
    producer_epoch: Final[int]

    def __init__(
        self,
        api_version: int,
        correlation_id: int,
        client_id: str | None,
        transactional_id: str | None,
        timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
    ) -> None:
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch


def read_init_request(frame: bytes, served: frozenset[int] | range) -> InitRequested | None:
    """The InitProducerId request in ``frame`` at a version of ``served`` in the usual shape
    (see the module's docstring); None for any other frame, which kio's reader then reads
    (or refuses) as before."""
    if len(frame) < 12 or frame[1] != _API_KEY_LOW_BYTE or frame[0] != 0:
        return None
    _, version, correlation_id, length = REQUEST_HEADER_START.unpack_from(frame)
    rest = _REST.get(version)
    if rest is None or version not in served or length < -1:
        return None
    at = 10
    client_id = None
    if length >= 0:
        at += length
        client_id = client_id_of(frame[10:at])  # (any bytes will do, as in Kafka)
    if version >= 2:
        # The header's tagged fields (none), then a compact nullable string: length + 1.
        if len(frame) < at + 2 or frame[at] != 0 or frame[at + 1] >= 0x80:
            return None
        size = frame[at + 1] - 1
        at += 2
    else:
        if len(frame) < at + 2:
            return None
        (size,) = _LEGACY_LENGTH.unpack_from(frame, at)
        at += 2
        if size < -1:
            return None
    transactional_id = None
    if size >= 0:
        transactional_id = utf8_string(frame[at : at + size])
        if transactional_id is None:
            return None  # as kio: a transactional id that is not UTF-8 is refused
        at += size
    if len(frame) != at + rest.size:
        return None
    values = rest.unpack_from(frame, at)
    if version >= 3:
        timeout, producer_id, producer_epoch, tags = values
        if tags:
            return None
        return InitRequested(
            version,
            correlation_id,
            client_id,
            transactional_id,
            timeout,
            producer_id,
            producer_epoch,
        )
    if version == 2 and values[1]:
        return None
    return InitRequested(version, correlation_id, client_id, transactional_id, values[0], -1, -1)


#: kio's transaction timeout is a timedelta; made once, not per request.
_ONE_MS: Final = datetime.timedelta(milliseconds=1)


def init_request_of(request: Request) -> InitRequested:
    """The InitProducerId kio read (``request``, any shape of a served version) as the
    value :func:`read_init_request` reads the usual shapes into."""
    header, body = request.header, request.body
    return InitRequested(
        header.api_version,
        header.correlation_id,
        header.client_id,
        body.transactional_id,
        int(body.transaction_timeout / _ONE_MS),
        getattr(body, "producer_id", -1),
        getattr(body, "producer_epoch", -1),
    )
