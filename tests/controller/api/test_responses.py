"""Response building: the ApiVersions answers, built and encoded once, are the bytes kio
writes for every version and every client software check."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.api.handlers import SERVED_APIS
from pidctl.controller.api.responses import ApiVersionsAnswers
from pidctl.protocol.apis import ApiKey, request_class, supported_apis
from pidctl.protocol.codec import (
    Request,
    decode_request,
    encode_request,
    encode_response_body,
    encode_response_generic,
)
from pidctl.protocol.server import ServerConnection

SUPPORTED = supported_apis(SERVED_APIS)


def _request(version: int, software: str) -> Request:
    cls: Any = request_class(ApiKey.API_VERSIONS, version)
    fields = {"client_software_name": software, "client_software_version": "1.0"}
    body = cls(**fields) if version >= 3 else cls()
    return decode_request(encode_request(body, 11, "t")[4:], SUPPORTED)


@pytest.mark.parametrize("version", range(5))
@pytest.mark.parametrize("software", ["pidctl-test", "-not valid-"])
def test_each_answer_is_built_once_and_framed_as_kio_writes_it(version: int, software: str) -> None:
    answers = ApiVersionsAnswers(SUPPORTED)
    request = _request(version, software)
    reply = answers.reply(request)
    assert answers.reply(_request(version, software)) is reply  # the same, not rebuilt
    assert reply.encoded == encode_response_body(reply.body)
    valid = version < 3 or software == "pidctl-test"
    assert reply.body.error_code == (ErrorCode.none if valid else ErrorCode.invalid_request)
    assert len(reply.body.api_keys) == (len(SUPPORTED) if valid else 0)
    sent = ServerConnection(SUPPORTED).send_encoded(request.header, reply.body, reply.encoded)
    assert sent == encode_response_generic(request.header, reply.body)
