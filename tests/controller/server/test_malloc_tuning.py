"""The pinned mmap threshold: big blocks freed between small allocations go back to the
system (each case in a fresh interpreter, as the threshold is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pidctl.controller.server.malloc_tuning import OPERATOR_SETTING

#: What a snapshot does to the C heap, in miniature: a copy of the table (one block, larger
#: each time), the table packed into a buffer that grows, and small allocations that outlive
#: both (the requests served meanwhile). Prints the RSS growth and what was kept, in KiB.
SNAPSHOTS = """
import sys
from pathlib import Path
from pidctl.controller.server.malloc_tuning import pin_mmap_threshold

def rss_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

pinned = pin_mmap_threshold() if sys.argv[1] == "pin" else False
kept = []
before = rss_kib()
for i in range(1, 20):
    copy = bytearray(i * 512 * 1024)
    packed = bytearray()
    while len(packed) < len(copy):
        packed += b"p" * 4096
        kept.append(bytes(600))
    del copy, packed
print(pinned, rss_kib() - before, len(kept) * 600 // 1024)
"""


def growth(mode: str, env: dict[str, str] | None = None) -> tuple[bool, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", SNAPSHOTS, mode], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


def test_pinned_threshold_returns_snapshot_sized_blocks_to_the_system() -> None:
    pinned, pinned_kib, kept_kib = growth("pin")
    if not pinned:
        pytest.skip("not glibc: nothing to pin")
    _, moving_kib, _ = growth("leave")
    assert pinned_kib < 1.2 * kept_kib + 1024  # what was kept, and little more
    assert moving_kib > pinned_kib + 8 * 1024  # glibc's moving threshold keeps the holes


def test_an_operator_setting_is_left_alone() -> None:
    pinned, _, _ = growth("pin", {**os.environ, OPERATOR_SETTING: "65536"})
    assert not pinned
