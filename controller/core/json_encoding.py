"""JSON encoders built once, for the lines written on every request (log records, log lines).

``json.dumps`` and ``JSONEncoder.encode`` build a new C encoder object (and a dict of the
objects seen, against cycles) on every call; for a ten-field dict that is 40 % of the time.
An encoder from :func:`json_encoder` is built once and gives the same text as
``json.dumps(value, separators=..., default=...)`` for the acyclic data pidctl writes.
An encoder from :func:`object_encoder` writes objects whose keys and value types are known
in advance (a record's fields, an audit line's) from a template, three times as fast.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Sequence
from typing import Any, Final


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_encoder(
    separators: tuple[str, str] = (", ", ": "),
    default: Callable[[Any], Any] | None = None,
) -> Callable[[Any], str]:
    """An encoder giving ``json.dumps(value, separators=separators, default=default)``
    (ASCII only, keys in insertion order). No cycle check: a value that contains itself
    recurses until RecursionError rather than raising ValueError."""
    item_separator, key_separator = separators
    # CPython's C encoder, as JSONEncoder.iterencode uses it (not in the module's __all__).
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python built without the C accelerator: the plain encoder
        return json.JSONEncoder(separators=separators, default=default).encode
    encode = make(
        None,  # no cycle check
        default or _refuse,
        json.encoder.encode_basestring_ascii,
        None,  # no indent
        key_separator,
        item_separator,
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan, as json.dumps
    )
    return lambda value: "".join(encode(value, 0))


def _optional_string(value: str | None) -> str:
    return "null" if value is None else json.encoder.encode_basestring_ascii(value)


#: The conversion of a field's value to JSON text, by the field's annotated type ("int"
#: fields are formatted by ``%d`` in the object's template itself).
_CONVERSIONS: Final[dict[str, Callable[[Any], str]]] = {
    "str": json.encoder.encode_basestring_ascii,
    "str | None": _optional_string,
}


def _by_value(generic: Callable[[Any], str]) -> Callable[[Any], str]:
    """The conversion of a field whose annotation names no simpler one: None, a str and an
    int written at once, anything else through ``generic``. Compiled, a union such as
    ``str | None`` is left only as ``type`` (records.py's ``_kind``): a grant's principal
    and client id took 2,300 instructions each through the generic encoder, 830 here."""
    escape = json.encoder.encode_basestring_ascii

    def convert(value: Any) -> str:
        if value is None:
            return "null"
        kind = type(value)  # exactly: a bool is an int, and an enum a str or an int
        if kind is str:
            return escape(value)
        if kind is int:
            return str(value)
        return generic(value)

    return convert


def object_encoder(
    fields: Sequence[tuple[str, str]],
    separators: tuple[str, str] = (", ", ": "),
    default: Callable[[Any], Any] | None = None,
) -> Callable[[Sequence[Any]], str]:
    """An encoder of JSON objects with these keys in this order, from their values in the
    same order: the text ``json.dumps(dict(zip(keys, values)), separators=separators,
    default=default)`` gives, made by one %-format of a template built once.

    Each field comes with its annotated type. An ``int`` field is formatted with ``%d``; it
    must hold an int (``%d`` would write 1 for True, and 1 for 1.5). ``str`` and
    ``str | None`` fields are escaped as JSON strings; any other type goes by its value's
    (:func:`_by_value`), through :func:`json_encoder` but for None, a str or an int. For the
    lines written on every request, where the generic encoder spends most of its time on
    each value's type and each key's escaping."""
    item_separator, key_separator = separators
    generic = _by_value(json_encoder(separators, default))
    parts: list[str] = []
    conversions: list[tuple[int, Callable[[Any], str]]] = []
    for index, (key, kind) in enumerate(fields):
        key_text = json.encoder.encode_basestring_ascii(key).replace("%", "%%")
        parts.append(key_text + key_separator + ("%d" if kind == "int" else "%s"))
        if kind != "int":
            conversions.append((index, _CONVERSIONS.get(kind, generic)))
    template = "{" + item_separator.join(parts) + "}"

    def encode(values: Sequence[Any]) -> str:
        texts = list(values)
        for index, convert in conversions:
            texts[index] = convert(texts[index])
        return template % tuple(texts)

    return encode
