"""The stall probe: a process stopped for a known time reports one stall that long."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ops.bench.stalls import (
    STALL_S,
    Stalls,
    finish_probe,
    host_check,
    stall_probe,
    start_probe,
)


def test_only_wake_ups_later_than_the_threshold_count() -> None:
    stalls = Stalls(seconds=2.0)
    for late in (0.0, STALL_S / 2, STALL_S, 0.003, 0.010):
        stalls.add(late)
    assert (stalls.count, stalls.longest_s) == (2, 0.010)
    assert stalls.summary() == pytest.approx(
        {"stalls_per_s": 1.0, "stalled_ms_per_s": 6.5, "longest_stall_ms": 10.0}
    )


def test_a_probe_stopped_for_200_ms_reports_a_stall_at_least_that_long() -> None:
    proc = start_probe()
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(0.2)  # the stall being made, not a wait for something
    os.kill(proc.pid, signal.SIGCONT)
    stalls = finish_probe(proc)
    assert stalls.count >= 1
    assert stalls.longest_s >= 0.19
    assert stalls.seconds >= stalls.longest_s


def test_the_context_fills_in_what_the_probe_saw_when_the_block_ends() -> None:
    with stall_probe() as stalls:
        assert stalls.seconds == 0.0  # not yet
        deadline = time.monotonic() + 0.1
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert stalls.seconds >= 0.1
    assert set(stalls.summary()) == {"stalls_per_s", "stalled_ms_per_s", "longest_stall_ms"}


def test_the_host_check_probes_beside_each_load_and_really_syncs(tmp_path: Path) -> None:
    results = host_check(0.3, str(tmp_path))
    assert list(results) == ["spin", "fdatasync", "spin+fdatasync"]
    for summary in results.values():
        assert summary["stalled_ms_per_s"] >= 0 and summary["longest_stall_ms"] >= 0
    # Both loads that sync appended to the same file: 600 bytes at a time.
    size = (tmp_path / "sync-loop").stat().st_size
    assert size > 0 and size % 600 == 0
