"""JSON encoders built once, for the lines written on every request (log records, log lines).

``json.dumps`` and ``JSONEncoder.encode`` build a new C encoder object (and a dict of the
objects seen, against cycles) on every call; for a ten-field dict that is 40 % of the time.
An encoder from :func:`json_encoder` is built once and gives the same text as
``json.dumps(value, separators=..., default=...)`` for the acyclic data pidctl writes.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any


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
