"""The precompiled answers are byte for byte what kio's generic writer makes."""

from __future__ import annotations

import datetime
import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from pidctl.protocol.api_versions import build_api_versions_response
from pidctl.protocol.apis import ApiKey, VersionRange, response_class
from pidctl.protocol.codec import (
    PRECOMPILED_RESPONSES,
    encode_response,
    encode_response_body,
    encode_response_generic,
    frame_response,
)
from pidctl.protocol.headers import RequestHeader

correlation_ids = st.integers(-(2**31), 2**31 - 1)
throttles = st.integers(0, 2**31 - 1).map(lambda ms: datetime.timedelta(milliseconds=ms))
errors = st.sampled_from(list(ErrorCode))
int64s = st.integers(-(2**63), 2**63 - 1)


def _header(api_key: int, version: int, correlation_id: int) -> RequestHeader:
    return RequestHeader(api_key, version, correlation_id, "client", 2)


@given(
    version=st.integers(0, 5),
    correlation_id=correlation_ids,
    throttle=throttles,
    error=errors,
    producer_id=int64s,
    epoch=st.integers(-(2**15), 2**15 - 1),
)
def test_init_producer_id(
    version: int,
    correlation_id: int,
    throttle: datetime.timedelta,
    error: ErrorCode,
    producer_id: int,
    epoch: int,
) -> None:
    cls: Any = response_class(ApiKey.INIT_PRODUCER_ID, version)
    body = cls(
        throttle_time=throttle,
        error_code=error,
        producer_id=i64(producer_id),
        producer_epoch=i16(epoch),
    )
    header = _header(ApiKey.INIT_PRODUCER_ID, version, correlation_id)
    assert encode_response(header, body) == encode_response_generic(header, body)


@given(
    correlation_id=correlation_ids,
    throttle=throttles,
    error=errors,
    start=int64s,
    length=st.integers(-(2**31), 2**31 - 1),
)
def test_allocate_producer_ids(
    correlation_id: int, throttle: datetime.timedelta, error: ErrorCode, start: int, length: int
) -> None:
    cls: Any = response_class(ApiKey.ALLOCATE_PRODUCER_IDS, 0)
    body = cls(
        throttle_time=throttle,
        error_code=error,
        producer_id_start=i64(start),
        producer_id_len=i32(length),
    )
    header = _header(ApiKey.ALLOCATE_PRODUCER_IDS, 0, correlation_id)
    assert encode_response(header, body) == encode_response_generic(header, body)


# Any listing of API ranges (kio's ApiVersion entry holds int16s).
listings = st.dictionaries(
    st.integers(0, 2**15 - 1),
    st.tuples(st.integers(0, 2**15 - 1), st.integers(0, 2**15 - 1)).map(sorted),
    max_size=20,
).map(lambda d: {k: VersionRange(lo, hi) for k, (lo, hi) in d.items()})


@given(
    version=st.integers(0, 4),
    correlation_ids=st.lists(correlation_ids, min_size=1, max_size=3),
    listing=listings,
    error=errors,
    throttle_ms=st.integers(0, 2**31 - 1),
)
def test_api_versions_encoded_once(
    version: int,
    correlation_ids: list[int],
    listing: dict[int, VersionRange],
    error: ErrorCode,
    throttle_ms: int,
) -> None:
    """An ApiVersions body encoded once (as the server's response building keeps it) and
    framed for several requests: each byte for byte kio's frame for its correlation id."""
    body = build_api_versions_response(version, listing, error, throttle_ms)
    encoded = encode_response_body(body)
    for correlation_id in correlation_ids:
        header = _header(ApiKey.API_VERSIONS, version, correlation_id)
        assert frame_response(header, body, encoded) == encode_response_generic(header, body)
        assert encode_response(header, body) == encode_response_generic(header, body)


@given(version=st.integers(4, 6), correlation_id=correlation_ids, throttle=throttles)
def test_a_body_encoded_ahead_under_a_flexible_header(
    version: int, correlation_id: int, throttle: datetime.timedelta
) -> None:
    """frame_response writes a v1 response header (its tagged fields) where the API has one."""
    cls: Any = response_class(ApiKey.FIND_COORDINATOR, version)
    body = cls(throttle_time=throttle, coordinators=())
    header = _header(ApiKey.FIND_COORDINATOR, version, correlation_id)
    encoded = encode_response_body(body)
    assert frame_response(header, body, encoded) == encode_response_generic(header, body)


def test_every_served_version_of_the_hot_apis_is_precompiled() -> None:
    assert set(PRECOMPILED_RESPONSES) == {
        *((ApiKey.INIT_PRODUCER_ID, v) for v in range(6)),
        (ApiKey.ALLOCATE_PRODUCER_IDS, 0),
        *((ApiKey.FIND_COORDINATOR, v) for v in range(4, 7)),
    }


texts = st.text(max_size=20)


@given(
    version=st.integers(4, 6),
    correlation_id=correlation_ids,
    throttle=throttles,
    entries=st.lists(
        st.tuples(
            texts,
            st.integers(-(2**31), 2**31 - 1),
            texts,
            st.integers(-(2**31), 2**31 - 1),
            errors,
            st.none() | texts,
        ),
        max_size=200,
    ),
)
def test_find_coordinator_v4(
    version: int,
    correlation_id: int,
    throttle: datetime.timedelta,
    entries: list[tuple[str, int, str, int, ErrorCode, str | None]],
) -> None:
    cls: Any = response_class(ApiKey.FIND_COORDINATOR, version)
    coordinator = sys.modules[cls.__module__].Coordinator
    body = cls(
        throttle_time=throttle,
        coordinators=tuple(
            coordinator(
                key=key,
                node_id=i32(node),
                host=host,
                port=i32(port),
                error_code=error,
                error_message=message,
            )
            for key, node, host, port, error, message in entries
        ),
    )
    header = _header(ApiKey.FIND_COORDINATOR, version, correlation_id)
    assert encode_response(header, body) == encode_response_generic(header, body)
