"""AllocateProducerIds requests read by ``struct``, and the one typed value every
AllocateProducerIds is handed to the controller as (:class:`BlockRequested`), whichever
reader read it.

Every broker's block request is an AllocateProducerIds v0 (the only version Kafka defines):
a header with a client id, a broker id and a broker epoch. kio's reader builds a header and
a body entity for it, field by field; a request in the usual shape (no tagged fields in the
header or the body) is read here instead into the four values the decision needs, and the
answer is packed by the codec (``allocate_producer_ids_answer``) without an entity either.
Anything else, an unusual but valid request included, is left to kio's reader, whose
request :func:`block_request_of` turns into the same value: the tests check that both read
every request alike.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from pidctl.protocol.apis import ApiKey
from pidctl.protocol.codec import Request
from pidctl.protocol.headers import REQUEST_HEADER_START, client_id_of

#: The API key's low byte (its high byte is 0).
_API_KEY_LOW_BYTE: Final = ApiKey.ALLOCATE_PRODUCER_IDS & 0xFF
#: After the client id: the header's empty tagged fields, broker id, broker epoch, the body's
#: empty tagged fields.
_BODY: Final = struct.Struct(">BiqB")


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class BlockRequested:
    """An AllocateProducerIds v0 request, read by ``struct`` or by kio."""

    correlation_id: Final[int]
    client_id: Final[str | None]
    broker_id: Final[int]
    broker_epoch: Final[int]

    def __init__(
        self, correlation_id: int, client_id: str | None, broker_id: int, broker_epoch: int
    ) -> None:
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch


def read_block_request(frame: bytes) -> BlockRequested | None:
    """The AllocateProducerIds v0 request in ``frame`` in the usual shape (see the module's
    docstring); None for any other frame, which kio's reader then reads (or refuses)."""
    if len(frame) < 24 or frame[1] != _API_KEY_LOW_BYTE or frame[0] != 0:
        return None
    _, version, correlation_id, length = REQUEST_HEADER_START.unpack_from(frame)
    if version != 0 or length < -1:
        return None
    start = 10 + length if length > 0 else 10
    if len(frame) != start + _BODY.size:
        return None
    header_tags, broker_id, broker_epoch, body_tags = _BODY.unpack_from(frame, start)
    if header_tags or body_tags:
        return None
    client_id = None
    if length >= 0:
        client_id = client_id_of(frame[10:start])
    return BlockRequested(correlation_id, client_id, broker_id, broker_epoch)


def block_request_of(request: Request) -> BlockRequested:
    """The AllocateProducerIds kio read (``request``, any shape) as the value
    :func:`read_block_request` reads the usual shape into."""
    header, body = request.header, request.body
    return BlockRequested(
        header.correlation_id, header.client_id, body.broker_id, body.broker_epoch
    )
