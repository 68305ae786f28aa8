"""The encoders built once give what ``json.dumps`` gives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidctl.controller.core.json_encoding import json_encoder

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=20,
)

_COMPACT = (",", ":")
_DEFAULT = (", ", ": ")


@pytest.mark.parametrize("separators", [_COMPACT, _DEFAULT])
@given(value=_values)
def test_same_text_as_json_dumps(separators: tuple[str, str], value: Any) -> None:
    assert json_encoder(separators)(value) == json.dumps(value, separators=separators)


def test_default_is_called_for_what_json_cannot_hold() -> None:
    encode = json_encoder(default=repr)
    value = {"kind": frozenset(), "nested": [{"type": int}]}
    assert encode(value) == json.dumps(value, default=repr)


def test_without_default_what_json_cannot_hold_is_refused() -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        json_encoder()({"members": {1}})
