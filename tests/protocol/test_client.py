from __future__ import annotations

import pytest
from kio.schema.api_versions.v0 import ApiVersionsRequest

from pidctl.controller.api.handlers import SERVED_APIS
from pidctl.protocol import requests
from pidctl.protocol.api_versions import build_api_versions_response
from pidctl.protocol.apis import supported_apis
from pidctl.protocol.client import ClientProtocol, ResponseOrderError
from pidctl.protocol.codec import decode_request, encode_response


def _answer(request_bytes: bytes) -> bytes:
    supported = supported_apis(SERVED_APIS)
    request = decode_request(request_bytes[4:], supported)
    return encode_response(request.header, build_api_versions_response(0, supported))


def test_pipelined_responses_match_requests_in_order() -> None:
    client = ClientProtocol()
    sent = [client.send(ApiVersionsRequest()) for _ in range(3)]
    assert client.outstanding == 3
    stream = b"".join(_answer(data) for _, data in sent)
    got = client.receive(stream[:10]) + client.receive(stream[10:])
    assert [cid for cid, _ in got] == [cid for cid, _ in sent]
    assert client.outstanding == 0


def test_out_of_order_response_is_refused() -> None:
    client = ClientProtocol()
    first = client.send(ApiVersionsRequest())
    second = client.send(ApiVersionsRequest())
    with pytest.raises(ResponseOrderError):
        client.receive(_answer(second[1]) + _answer(first[1]))


def test_a_request_sent_as_prefix_and_own_body_is_the_same_frame() -> None:
    """``send_prefix`` (a body the caller encodes, a Produce's record batches sent from
    their own buffers) frames it as ``send`` frames the entity, and its answer is matched."""
    import io

    from kio.serial import entity_writer

    whole, parts = ClientProtocol("c"), ClientProtocol("c")
    body = requests.metadata(["t"], version=12)
    _, framed = whole.send(body)
    encoded = io.BytesIO()
    entity_writer(type(body))(encoded, body)
    _, prefix = parts.send_prefix(3, 12, len(encoded.getvalue()))
    assert prefix + encoded.getvalue() == framed
    assert parts.outstanding == 1
