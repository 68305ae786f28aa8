"""Which build of pidctl is running: compiled by mypyc, or the sources interpreted.

The request path's modules (this one among them) are compiled to C extension modules from
the same sources in the wheel built on Linux x86-64 and in the Docker image; anywhere else
pidctl runs them as they are. Compiled, a module's ``__file__`` is its extension module.
"""

from __future__ import annotations

import importlib.machinery
from typing import Final

#: ``"compiled"`` when this module, and with it the request path's, is mypyc's extension
#: module; ``"interpreted"`` otherwise.
BUILD: Final = (
    "compiled"
    if __file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    else "interpreted"
)
