"""The C allocator's one setting that matters to a server holding many small objects.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB) by its own
``mmap`` and gives it back to the system when it is freed. But by default the threshold
*moves*: freeing such a block raises it to that block's size (up to 32 MiB), and from then
on blocks of that size come from the heap, where freeing one leaves a hole that later small
allocations pin. pidctl makes exactly such blocks again and again: every snapshot copies the
transactional-id table (one block of the dict's size, ~5 MiB for 100,000 ids) and packs it
(another), so a fresh server's resident set grew by about 100 bytes per transactional id
more than the table it holds. Pinning the threshold at its default keeps those blocks out of
the heap: their memory goes back to the system as soon as the snapshot is written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Final

#: ``M_MMAP_THRESHOLD`` in glibc's ``malloc.h``.
_M_MMAP_THRESHOLD: Final = -3

#: Blocks at least this large get an ``mmap`` of their own (glibc's default threshold).
MMAP_THRESHOLD_BYTES: Final = 128 * 1024

#: The environment variable through which an operator sets the threshold themselves (glibc
#: reads it at start-up); when it is set, pidctl leaves the threshold alone.
OPERATOR_SETTING: Final = "MALLOC_MMAP_THRESHOLD_"


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (which also stops it moving); return
    whether it was set. Nothing is done (False) when the C library is not glibc or the
    operator set :data:`OPERATOR_SETTING`."""
    if OPERATOR_SETTING in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
