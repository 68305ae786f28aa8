"""Idempotent InitProducerId requests read and answered by ``struct``, a run at a time.

Every idempotent producer's first request is an InitProducerId without a transactional id,
and the request path spends most of its time on those: kio's reader builds a body entity and
a header per request, the handler a response entity, each field by field. A request in the
shape every client sends (a header without tagged fields, no transactional id, no producer
id or epoch) is read here instead into the two numbers the answer needs, and answered by one
``struct.pack``. Consecutive ones are handed to the server as one run, which it decides at
once (:meth:`ServerConnection.take_idempotent_inits`). Anything else, an unusual but valid
request included, is left to kio's reader: the tests check that both read every request
alike and that the answers are kio's, byte for byte.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Final

from pidctl.protocol.apis import ApiKey
from pidctl.protocol.codec import INIT_PRODUCER_ID_ANSWER_V0, INIT_PRODUCER_ID_ANSWER_V2
from pidctl.protocol.headers import REQUEST_HEADER_START

#: The API key's two bytes: a frame's first byte is 0 and its second this for InitProducerId.
_API_KEY_LOW_BYTE: Final = ApiKey.INIT_PRODUCER_ID & 0xFF
#: After the client id, per version: the bytes the rest must be, but for the four bytes of
#: the transaction timeout (which an idempotent request may set to anything, and which is
#: not looked at), as (bytes before the timeout, bytes after it, the rest's length).
#: v0-v1 (header v1, not flexible): a null transactional id (int16 -1), the timeout.
#: v2 (header v2): the header's empty tagged fields, a null compact string, the timeout,
#: the body's empty tagged fields. v3+ also: producer id -1 and epoch -1 (none given).
_SHAPES: Final[dict[int, tuple[bytes, bytes, int]]] = {
    0: (b"\xff\xff", b"", 6),
    1: (b"\xff\xff", b"", 6),
    2: (b"\x00\x00", b"\x00", 7),
    **{version: (b"\x00\x00", b"\xff" * 10 + b"\x00", 17) for version in (3, 4, 5)},
}
#: Versions this module reads.
VERSIONS: Final = frozenset(_SHAPES)

Shapes = Mapping[int, tuple[bytes, bytes, int]]


@functools.cache
def shapes(versions: range | frozenset[int]) -> Shapes:
    """What :func:`read_idempotent_init` takes: the shapes of the ``versions`` it may read
    (those a server serves). Made once per set of versions: every connection asks."""
    return {version: _SHAPES[version] for version in versions if version in _SHAPES}


def read_idempotent_init(frame: bytes, served: Shapes) -> tuple[int, int] | None:
    """``(api_version, correlation_id)`` of an idempotent InitProducerId request at a version
    of ``served`` (:func:`shapes`) in the usual shape (see the module's docstring); None for
    any other frame, which kio's reader then reads (or refuses) as before."""
    if len(frame) < 10 or frame[1] != _API_KEY_LOW_BYTE or frame[0] != 0:
        return None
    _, version, correlation_id, length = REQUEST_HEADER_START.unpack_from(frame)
    shape = served.get(version)
    if shape is None or length < -1:
        return None
    # The shape (a transactional InitProducerId fails it here); any client id will do.
    start = 10 + length if length > 0 else 10
    before, after, size = shape
    if len(frame) != start + size or not frame.startswith(before, start):
        return None
    if not frame.endswith(after):
        return None
    return version, correlation_id


#: The answers' layouts are the codec's precompiled ones.
_ANSWER_V0: Final = INIT_PRODUCER_ID_ANSWER_V0
_ANSWER_V2: Final = INIT_PRODUCER_ID_ANSWER_V2
_SIZE_V0: Final = _ANSWER_V0.size - 4
_SIZE_V2: Final = _ANSWER_V2.size - 4


def answer_run(
    version: int, correlation_ids: list[int], producer_ids: Sequence[int], error: int
) -> list[bytes]:
    """The frames answering a run of idempotent InitProducerIds at ``version``, in order: a
    PID each with epoch 0 for the first ``len(producer_ids)``, then ``error`` (PID and epoch
    -1) for the rest. (One call per run, the packing inlined: this is the per-request cost.)"""
    granted = len(producer_ids)
    if version >= 2:
        pack, size = _ANSWER_V2.pack, _SIZE_V2
        frames = [
            pack(size, c, 0, 0, 0, pid, 0, 0)
            for c, pid in zip(correlation_ids, producer_ids, strict=False)
        ]
        if granted < len(correlation_ids):
            frames += [pack(size, c, 0, 0, error, -1, -1, 0) for c in correlation_ids[granted:]]
    else:
        pack, size = _ANSWER_V0.pack, _SIZE_V0
        frames = [
            pack(size, c, 0, 0, pid, 0)
            for c, pid in zip(correlation_ids, producer_ids, strict=False)
        ]
        if granted < len(correlation_ids):
            frames += [pack(size, c, 0, error, -1, -1) for c in correlation_ids[granted:]]
    return frames
