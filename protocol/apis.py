"""The APIs pidctl speaks, their version ranges, and the kio entity classes for each version."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import IntEnum
from functools import cache
from types import MappingProxyType
from typing import cast, get_args

from kio.index import load_request_schema, load_response_schema
from kio.static.protocol import RequestPayload, ResponsePayload


class ApiKey(IntEnum):
    """Kafka API keys (``ApiKeys.java``) that pidctl knows about."""

    METADATA = 3
    CONTROLLED_SHUTDOWN = 7
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    SASL_AUTHENTICATE = 36
    DESCRIBE_CLUSTER = 60
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    ALLOCATE_PRODUCER_IDS = 67


@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of API versions."""

    min: int
    max: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min <= version <= self.max


#: What a server advertises in ApiVersions and accepts: API key -> supported versions.
SupportedApis = Mapping[int, VersionRange]


def supported_apis(ranges: Mapping[ApiKey, tuple[int, int]]) -> SupportedApis:
    """Build an immutable table of supported APIs, checking kio has every version in it."""
    table = {int(key): VersionRange(lo, hi) for key, (lo, hi) in ranges.items()}
    for key, versions in table.items():
        for version in range(versions.min, versions.max + 1):
            request_class(key, version)  # raises if kio lacks the schema
    return MappingProxyType(table)


@cache
def request_class(api_key: int, api_version: int) -> type[RequestPayload]:
    """The kio request entity for this API version (cached: schema lookup imports modules)."""
    return load_request_schema(api_key, api_version)


@cache
def response_class(api_key: int, api_version: int) -> type[ResponsePayload]:
    """The kio response entity for this API version."""
    return load_response_schema(api_key, api_version)


@cache
def entity_class(message: type, field_name: str) -> type:
    """The class of the entries of ``message``'s array field ``field_name`` (a kio message
    or entity class): ``entity_class(MetadataResponse v12, "topics")`` is its
    ``MetadataResponseTopic``. Read from the dataclass's field type, once per pair."""
    for field in fields(message):
        if field.name == field_name:
            array = field.type  # tuple[Entry, ...], or tuple[Entry, ...] | None
            if type(None) in get_args(array):
                (array,) = (t for t in get_args(array) if t is not type(None))
            (entry, _) = get_args(array)
            return cast(type, entry)
    raise LookupError(f"{message.__qualname__} has no field {field_name!r}")


def request_header_version(api_key: int, api_version: int) -> int:
    """The request header version a client uses for this API version.

    Flexible versions use header v2 (with tagged fields), others v1. The one exception Kafka
    keeps is ControlledShutdown v0, which predates the client id and uses header v0.
    """
    if api_key == ApiKey.CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    if api_key == ApiKey.API_VERSIONS:
        # ApiVersions must be parseable at any version, even ones we do not know: v3 made it
        # flexible, and every later version will stay so.
        return 2 if api_version >= 3 else 1
    return 2 if request_class(api_key, api_version).__flexible__ else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """The response header version: v1 for flexible versions, except ApiVersions, always v0.

    ApiVersions' response header stays v0 so that a client which does not yet know what the
    server supports can always read the correlation id.
    """
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if response_class(api_key, api_version).__flexible__ else 0
