"""`pidctl log dump --summary`: blocks per holder, jobs by client id, leases, imports, holes;
and how a text line shows a value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pidctl.controller.core.logformat import LogEntry
from pidctl.controller.core.records import (
    BrokerRegistered,
    ClusterCreated,
    ControllerStarted,
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsLeased,
    Record,
)
from pidctl.controller.log.logtools import shown, summary_lines

T0 = 1_795_000_000_000  # any time: the summary prints only counts and ids


def _entries(*records: Record) -> list[LogEntry]:
    return [LogEntry(i, T0 + i * 1000, r) for i, r in enumerate(records)]


def test_summary_of_a_single_controller() -> None:
    lines = summary_lines(
        _entries(
            ClusterCreated("c", 1),
            ControllerStarted(1, "test"),
            BrokerRegistered(10, "a", 2),
            ProducerIdsGranted(10, 2, 0, 1000),
            ProducerIdsGranted(-1, -1, 1000, 2000, "User:spark", "app-1", "job"),
            ProducerIdsGranted(-1, -1, 2000, 3000, "User:spark", "app-2", "job"),
            ProducerIdsGranted(-1, -1, 3000, 4000, "User:spark", "app-1", "job"),
            ProducerIdFloorRaised(10_000, "zookeeper zk:2181/latest_producer_id_block"),
            ProducerIdsGranted(10, 2, 10_000, 11_000),
        )
    )
    assert lines[0] == "blocks granted: 5 (5000 producer ids)"
    assert "  broker 10: 2 blocks, 2000 producer ids, 0..10999, epochs [2]" in lines
    assert "  job app-1: 2 blocks, 2000 producer ids, 1000..3999" in lines
    assert "  job app-2: 1 blocks, 1000 producer ids, 2000..2999" in lines
    assert lines[lines.index("high-water mark imports:") + 1].endswith(
        "by zookeeper zk:2181/latest_producer_id_block"
    )
    assert lines[-2:] == ["holes in the granted range: 1", "  4000..9999 never granted"]


def test_holes_between_leases_are_other_controllers_ranges() -> None:
    lines = summary_lines(
        _entries(
            ClusterCreated("c", 2),
            ProducerIdsLeased(0, 3000, "etcd://e:2379/p", 5),
            ProducerIdsGranted(2, -1, 0, 1000, holder="controller"),
            ProducerIdsGranted(2, -1, 1000, 2000, holder="controller"),
            ProducerIdsLeased(5000, 7000, "etcd://e:2379/p", 9),
            ProducerIdsGranted(2, -1, 5000, 6000, holder="controller"),
        )
    )
    assert "leases from etcd: 2 (5000 producer ids)" in lines
    assert lines[-2:] == [
        "holes in the granted range: 1",
        "  2000..4999 never granted (1000 of them leased here and left unused)",
    ]
    other = summary_lines(
        _entries(
            ClusterCreated("c", 2),
            ProducerIdsLeased(0, 1000, "etcd://e:2379/p", 5),
            ProducerIdsGranted(2, -1, 0, 1000, holder="controller"),
            ProducerIdsLeased(5000, 6000, "etcd://e:2379/p", 9),
            ProducerIdsGranted(2, -1, 5000, 6000, holder="controller"),
        )
    )
    assert other[-1] == "  1000..4999 never granted (not leased here: other controllers' ranges)"


def _read_back(text: str) -> str:
    """What a shown value says (logfmt: quoted, with Python's escapes)."""
    if not text.startswith('"'):
        return text
    inner = text[1:-1]
    return inner.encode("latin-1", "backslashreplace").decode("unicode_escape")


@given(st.text())
def test_a_shown_value_is_one_printable_field_that_reads_back_as_it_was(value: str) -> None:
    text = shown(value)
    assert text.isprintable()  # no newline, no ESC, no separator, no override
    assert _read_back(text) == value
    # One field: a space, "=" or "," only inside quotes.
    assert text.startswith('"') or not set(text) & set(' =",')


def test_plain_values_are_shown_as_they_are() -> None:
    assert shown("User:ANONYMOUS") == "User:ANONYMOUS"
    assert shown("spark-app-42") == "spark-app-42"
    assert shown(1000) == "1000"
    assert shown("zoë") == "zoë"
    assert shown("x\ny") == '"x\\x0ay"'
    assert shown("User:CN=a,O=b") == '"User:CN=a,O=b"'
    assert shown(("PLAINTEXT://k:1", "SSL://k:2")) == "PLAINTEXT://k:1,SSL://k:2"
