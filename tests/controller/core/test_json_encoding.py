"""The encoders built once give what ``json.dumps`` gives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidctl.controller.core.json_encoding import json_encoder, object_encoder

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


#: (annotated type, a strategy for its values); the last is any other type.
_KINDS = {
    "int": st.integers(min_value=-(2**70), max_value=2**70),
    "str": st.text(max_size=12),
    "str | None": st.one_of(st.none(), st.text(max_size=12)),
    "tuple[str, ...]": st.lists(st.text(max_size=4), max_size=3),
    # What a union is compiled (records.py's _kind): any value, converted by its type.
    "type": st.one_of(
        st.none(),
        st.text(max_size=6),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.booleans(),
        st.floats(allow_nan=False),
        st.lists(st.integers(), max_size=2),
    ),
}


@st.composite
def _objects(draw: st.DrawFn) -> tuple[list[tuple[str, str]], list[Any]]:
    keys = draw(st.lists(st.text(max_size=8), unique=True, max_size=8))
    kinds = [draw(st.sampled_from(sorted(_KINDS))) for _ in keys]
    return list(zip(keys, kinds, strict=True)), [draw(_KINDS[kind]) for kind in kinds]


@pytest.mark.parametrize("separators", [_COMPACT, _DEFAULT])
@given(fields_and_values=_objects())
def test_object_encoder_gives_what_json_dumps_gives_for_the_dict(
    separators: tuple[str, str], fields_and_values: tuple[list[tuple[str, str]], list[Any]]
) -> None:
    fields, values = fields_and_values
    as_dict = dict(zip((key for key, _ in fields), values, strict=True))
    encode = object_encoder(fields, separators)
    assert encode(values) == json.dumps(as_dict, separators=separators)


def test_object_encoder_keys_may_hold_percent_signs() -> None:
    encode = object_encoder([("100%", "int"), ("%s", "str")])
    assert encode([1, "x"]) == '{"100%": 1, "%s": "x"}'
