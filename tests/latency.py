"""A well-behaved client's latency, with and without an attacker in the same run.

A fixed bound alone (p99 < 250 ms) fails on a busy machine for reasons of its own, and a
bound relative to a baseline alone passes an attack that slows everything evenly; so the
attacked p99 must stay under the issue's 250 ms or, on a machine so busy that even the
baseline is slow, under a multiple of the baseline measured just before in the same run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: The issue's bound on a well-behaved client's p99 while another client attacks.
LATENCY_BOUND_S = 0.25
#: On a machine so busy that the baseline itself is slow: the attacked p99 may be this many
#: times the baseline's. An attack that holds the event loop for seconds exceeds both.
BASELINE_FACTOR = 10


@dataclass(frozen=True)
class Latencies:
    """Sorted latencies of one series, in seconds."""

    values: list[float]

    @property
    def p99(self) -> float:
        return self.values[min(len(self.values) - 1, int(len(self.values) * 0.99))]

    @property
    def worst(self) -> float:
        return self.values[-1]


def measure(request: Callable[[], None], count: int) -> Latencies:
    """``count`` calls of ``request``, each timed."""
    values: list[float] = []
    for _ in range(count):
        started = time.monotonic()
        request()
        values.append(time.monotonic() - started)
    return Latencies(sorted(values))


def measure_while(
    request: Callable[[], None], minimum: int, until: Callable[[], bool]
) -> Latencies:
    """Timed calls of ``request``: at least ``minimum``, and until ``until()`` holds."""
    values: list[float] = []
    while len(values) < minimum or not until():
        started = time.monotonic()
        request()
        values.append(time.monotonic() - started)
    return Latencies(sorted(values))


def measure_paced(
    request: Callable[[], None], interval_s: float, minimum: int, until: Callable[[], bool]
) -> Latencies:
    """Calls of ``request`` every ``interval_s`` (at least ``minimum``, and until ``until()``
    holds), each timed; a call that took longer stands also for the calls a client sending
    every ``interval_s`` would have waited with meanwhile (HdrHistogram's correction for
    coordinated omission): one stall of a second is then a hundred late answers at 10 ms,
    not one answer among thousands."""
    values: list[float] = []
    calls = 0
    while calls < minimum or not until():
        _paced_call(request, interval_s, values)
        calls += 1
    return Latencies(sorted(values))


def measure_paced_beside(
    request: Callable[[], None],
    baseline: Callable[[], None],
    interval_s: float,
    minimum: int,
    until: Callable[[], bool],
) -> tuple[Latencies, Latencies]:
    """:func:`measure_paced` of ``request``, and of ``baseline`` at the same time in a thread
    of its own, each every ``interval_s``: a machine or a disk that stalls holds both up in
    the same seconds. (Taking turns, a stall fell on one of them only: one 0.7 s stall of
    this disk during a sync of the server under test counted as 70 late answers of it alone,
    and failed a test that a whole expiry in one piece would fail.)"""
    measured: list[float] = []
    baseline_values: list[float] = []
    done = threading.Event()
    failed: list[BaseException] = []

    def run_baseline() -> None:
        try:
            while not done.is_set():
                _paced_call(baseline, interval_s, baseline_values)
        except BaseException as e:  # raised in the caller's thread, below
            failed.append(e)

    thread = threading.Thread(target=run_baseline, name="baseline", daemon=True)
    thread.start()
    try:
        calls = 0
        while calls < minimum or not until():
            _paced_call(request, interval_s, measured)
            calls += 1
    finally:
        done.set()
        thread.join()
    if failed:
        raise failed[0]
    return Latencies(sorted(measured)), Latencies(sorted(baseline_values))


def _paced_call(call: Callable[[], None], interval_s: float, values: list[float]) -> None:
    """One timed call, with the late answers it stands for (see :func:`measure_paced`),
    then the rest of its interval."""
    started = time.monotonic()
    call()
    took = time.monotonic() - started
    values.append(took)
    missed = took - interval_s
    while missed > 0:
        values.append(missed)
        missed -= interval_s
    if took < interval_s:
        time.sleep(interval_s - took)


def bound(baseline: Latencies) -> float:
    """The most the attacked p99 may be, given the baseline of the same run."""
    return max(LATENCY_BOUND_S, BASELINE_FACTOR * baseline.p99)
