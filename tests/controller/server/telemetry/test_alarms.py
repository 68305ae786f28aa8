"""An alarm: /readyz's reason while it lasts, an error line at once and then at most every
``interval_s`` (with how often it sounded meanwhile), one line when it is over."""

from __future__ import annotations

import structlog

from pidctl.controller.server.telemetry.alarms import Alarm, ThrottledLine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sounding_fails_readyz_and_logs_at_once_then_at_most_every_interval() -> None:
    faults: dict[str, str] = {}
    clock = Clock()
    alarm = Alarm("producer_ids", "no producer id left", faults, interval_s=10, clock=clock)
    with structlog.testing.capture_logs() as logs:
        assert alarm.sound("used up", refused="InitProducerId")
        assert faults == {"producer_ids": "used up"} and alarm.active
        for _ in range(5):
            clock.now += 1
            assert not alarm.sound("used up")  # within the interval: counted, not logged
        clock.now += 5
        assert alarm.sound("used up")  # 10 s after the first line
    assert [(line["event"], line["log_level"], line["times"]) for line in logs] == [
        ("no producer id left", "error", 1),
        ("no producer id left", "error", 6),  # the five unlogged and this one
    ]
    assert logs[0]["reason"] == "used up" and logs[0]["refused"] == "InitProducerId"


def test_a_new_reason_is_logged_at_once() -> None:
    faults: dict[str, str] = {}
    alarm = Alarm("disk_space", "data dir nearly full", faults, clock=Clock())
    with structlog.testing.capture_logs() as logs:
        alarm.sound("1 MiB free")
        assert alarm.sound("0.5 MiB free")
    assert [line["reason"] for line in logs] == ["1 MiB free", "0.5 MiB free"]
    assert faults == {"disk_space": "0.5 MiB free"}


def test_clearing_ends_the_readyz_reason_with_one_line_and_starts_afresh() -> None:
    faults = {"other": "kept"}
    clock = Clock()
    alarm = Alarm("disk_space", "data dir nearly full", faults, interval_s=10, clock=clock)
    with structlog.testing.capture_logs() as logs:
        alarm.clear()  # not sounding: nothing to say
        alarm.sound("low")
        alarm.clear(free_bytes=5)
        alarm.clear()
        assert faults == {"other": "kept"} and not alarm.active
        clock.now += 1
        assert alarm.sound("low")  # a new episode is logged at once
    assert [line["event"] for line in logs] == [
        "data dir nearly full",
        "data dir nearly full: over",
        "data dir nearly full",
    ]
    assert logs[1]["log_level"] == "warning" and logs[1]["free_bytes"] == 5


def test_a_throttled_line_is_due_at_once_then_every_interval_with_the_count_between() -> None:
    clock = Clock()
    line = ThrottledLine(interval_s=10, clock=clock)
    assert line.due("max_connections") == 1
    for _ in range(99):
        clock.now += 0.05
        assert line.due("max_connections") == 0  # counted
    assert line.due("max_connections_per_address") == 100  # a new reason: at once
    clock.now += 10
    assert line.due("max_connections_per_address") == 1
    line.reset()
    assert line.due("max_connections_per_address") == 1
