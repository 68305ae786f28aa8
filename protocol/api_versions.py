"""ApiVersions (key 18): what every client asks first."""

from __future__ import annotations

import datetime
import re
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from pidctl.protocol.apis import ApiKey, SupportedApis, entity_class, response_class

# KIP-511: client software name and version must match this (Kafka's ApiVersionsRequest.isValid).
_SOFTWARE: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")

#: The finalized-features epoch of an answer that finalizes no feature (Kafka's "none": -1).
#: pidctl advertises no features (v3+ answers list none, supported or finalized): a Kafka 4
#: client turns on transactions v2 (KIP-890: an epoch bump per transaction, EndTxn v5) only
#: when the finalized feature ``transaction.version`` is 2 or more, and that protocol needs
#: transaction APIs pidctl does not serve. Without it the client keeps the classic protocol,
#: whose InitProducerId pidctl serves (tests/e2e/test_java_client.py shows both paths).
NO_FINALIZED_FEATURES_EPOCH: Final = -1


def build_api_versions_response(
    version: int,
    supported: SupportedApis,
    error_code: ErrorCode = ErrorCode.none,
    throttle_ms: int = 0,
) -> Any:
    """An ApiVersionsResponse at ``version`` listing every supported API range, and (v3+)
    no features: see :data:`NO_FINALIZED_FEATURES_EPOCH`."""
    cls = response_class(ApiKey.API_VERSIONS, version)
    entry = entity_class(cls, "api_keys")
    api_keys = tuple(
        entry(api_key=i16(key), min_version=i16(r.min), max_version=i16(r.max))
        for key, r in sorted(supported.items())
    )
    fields: dict[str, Any] = {"error_code": error_code, "api_keys": api_keys}
    if version >= 1:
        fields["throttle_time"] = datetime.timedelta(milliseconds=throttle_ms)
    if version >= 3:
        fields["supported_features"] = ()
        fields["finalized_features_epoch"] = i64(NO_FINALIZED_FEATURES_EPOCH)
        fields["finalized_features"] = ()
    return cls(**fields)


def unsupported_version_response(supported: SupportedApis) -> Any:
    """The answer to an ApiVersions request at a version we do not know: UNSUPPORTED_VERSION in
    the v0 layout (which every client can read), listing ApiVersions' own range only, as Kafka
    does (KIP-511), so the client can retry at the highest version we have."""
    own: SupportedApis = {ApiKey.API_VERSIONS.value: supported[ApiKey.API_VERSIONS]}
    return build_api_versions_response(0, own, ErrorCode.unsupported_version)


def invalid_request_response(version: int) -> Any:
    """The answer to an ApiVersions request whose client software name or version is not
    valid (KIP-511): INVALID_REQUEST listing no API, as Kafka answers."""
    return build_api_versions_response(version, {}, ErrorCode.invalid_request)


def has_valid_client_software(request: Any) -> bool:
    """KIP-511 validation of ApiVersions v3+ ``client_software_name``/``version``.

    Kafka answers INVALID_REQUEST when either does not match its pattern.
    """
    if request.__version__ < 3:
        return True
    return bool(
        _SOFTWARE.fullmatch(request.client_software_name)
        and _SOFTWARE.fullmatch(request.client_software_version)
    )
