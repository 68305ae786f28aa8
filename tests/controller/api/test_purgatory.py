"""The purgatory on its own: answers held by key until their offset is durable, released in
the order held, without a socket, a task or a log."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pidctl.controller.api.purgatory import Purgatory
from pidctl.controller.api.responses import NO_WAIT


def test_an_answer_waits_for_its_offset_and_those_behind_it_for_it() -> None:
    purgatory: Purgatory[str] = Purgatory()
    assert purgatory.hold("a", 5, b"first", [("init_producer_id", 1.0)]) == 5
    # Decided after the first, durable already (NO_WAIT): it waits behind the first.
    assert purgatory.hold("a", NO_WAIT, b"second", [("api_versions", 2.0)]) == 5
    purgatory.hold("b", 2, b"other", [("metadata", 3.0)])
    assert purgatory.requests("a") == 2 and purgatory.held_bytes("a") == 11
    assert purgatory.release(3) == [("b", b"other", [("metadata", 3.0)])]
    assert not purgatory.holds("b") and purgatory.holds("a")
    assert purgatory.release(5) == []  # durable up to 5, exclusive: offset 5 is not yet
    assert purgatory.release(6) == [
        ("a", b"firstsecond", [("init_producer_id", 1.0), ("api_versions", 2.0)])
    ]
    assert not purgatory.holds("a") and purgatory.requests("a") == 0


def test_a_key_that_waits_again_starts_from_nothing() -> None:
    """An emptied or dropped key's queue serves the next key that waits: it carries none of
    what it held, nor its totals."""
    purgatory: Purgatory[str] = Purgatory()
    purgatory.hold("a", 1, b"aaaa", [("x", 0.0), ("x", 0.0)])
    purgatory.hold("d", 9, b"dd", [("x", 0.0)])
    purgatory.drop("d")
    assert [key for key, _, _ in purgatory.release(2)] == ["a"]
    for key in ("b", "c"):  # the two spare queues, then none
        assert purgatory.hold(key, 3, b"b", [("y", 1.0)]) == 3
    assert purgatory.requests("b") == purgatory.requests("c") == 1
    assert purgatory.held_bytes("b") == 1 and purgatory.held("a") is None
    assert purgatory.release(4) == [("b", b"b", [("y", 1.0)]), ("c", b"b", [("y", 1.0)])]


def test_a_dropped_key_releases_nothing() -> None:
    purgatory: Purgatory[str] = Purgatory()
    purgatory.hold("gone", 1, b"late", [])
    purgatory.drop("gone")
    purgatory.drop("never held")
    assert purgatory.release(100) == [] and not purgatory.holds("gone")


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("hold"), st.integers(0, 3), st.integers(-1, 30)),
            st.tuples(st.just("release"), st.just(0), st.integers(0, 40)),
        ),
        max_size=60,
    )
)
def test_every_answer_leaves_once_durable_and_in_the_order_held(
    steps: list[tuple[str, int, int]],
) -> None:
    """Whatever the holds and releases: each key's answers come out once each, in the
    order held, never before their offset (or one held before them on that key) is
    durable; nothing durable stays held after a release."""
    purgatory: Purgatory[int] = Purgatory()
    pending: dict[int, list[tuple[int, bytes]]] = {}  # the model: per key, oldest first
    durable = 0
    for count, (action, key, value) in enumerate([*steps, ("release", 0, 0)]):
        if action == "hold":
            data = f"{count};".encode()
            waits_for = max([value, *(offset for offset, _ in pending.get(key, [])[-1:])])
            assert purgatory.hold(key, value, data, [("x", 0.0)]) == waits_for
            pending.setdefault(key, []).append((waits_for, data))
            continue
        durable = max(durable, value)
        expected = {}
        for held_key, answers in pending.items():
            gone = [data for offset, data in answers if offset < durable]
            if gone:
                expected[held_key] = b"".join(gone)
                del answers[: len(gone)]
        released = purgatory.release(durable)
        assert {k: data for k, data, _ in released} == expected
        assert all(len(timings) == data.count(b";") for _, data, timings in released)
        for held_key, answers in pending.items():
            assert purgatory.requests(held_key) == len(answers)
            assert purgatory.held_bytes(held_key) == sum(len(data) for _, data in answers)
            assert purgatory.holds(held_key) == bool(answers)
