"""The precompiled answers are byte for byte what kio's generic writer makes."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from pidctl.protocol.apis import ApiKey, response_class
from pidctl.protocol.codec import (
    PRECOMPILED_RESPONSES,
    encode_response,
    encode_response_generic,
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


def test_every_served_version_of_both_apis_is_precompiled() -> None:
    assert set(PRECOMPILED_RESPONSES) == {
        *((ApiKey.INIT_PRODUCER_ID, v) for v in range(6)),
        (ApiKey.ALLOCATE_PRODUCER_IDS, 0),
    }
