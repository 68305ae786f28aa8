"""The event loop's counters and histograms expose what prometheus_client's would, for the
same changes (apart from the creation times)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pidctl.controller.server.telemetry.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 1.0)
LABELS = st.sampled_from(["a", "b", "c"])


def exposition(registry: CollectorRegistry) -> str:
    """The text format without the ``_created`` samples (times differ by construction)."""
    text = generate_latest(registry).decode()
    return re.sub(r"^\S+_created(\{[^}]*\})? \S+\n", "", text, flags=re.M)


@given(st.lists(st.tuples(LABELS, st.floats(0, 1e6))))
def test_a_labelled_counter_exposes_what_prometheus_client_would(
    changes: list[tuple[str, float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCounter("pidctl_things", "Things.", ["kind"], registry=ours)
    reference = Counter("pidctl_things", "Things.", ["kind"], registry=theirs)
    for label, amount in changes:
        loop.labels(label).inc(amount)
        reference.labels(label).inc(amount)
    assert exposition(ours) == exposition(theirs)


@given(st.lists(st.floats(0, 1e6)))
def test_an_unlabelled_counter_is_exported_from_the_start(amounts: list[float]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCounter("pidctl_bytes", "Bytes.", registry=ours)
    reference = Counter("pidctl_bytes", "Bytes.", registry=theirs)
    assert exposition(ours) == exposition(theirs)
    for amount in amounts:
        loop.inc(amount)
        reference.inc(amount)
    assert exposition(ours) == exposition(theirs)


# Values on the bounds themselves, just beside them, and anywhere.
VALUES = st.one_of(
    st.sampled_from([0.0, *BUCKETS, 0.00049, 0.00051, 2.0]), st.floats(0, 10, allow_nan=False)
)


@given(st.lists(st.tuples(LABELS, VALUES)))
def test_a_labelled_histogram_exposes_what_prometheus_client_would(
    observations: list[tuple[str, float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("pidctl_seconds", "Time.", ["api"], buckets=BUCKETS, registry=ours)
    reference = Histogram("pidctl_seconds", "Time.", ["api"], buckets=BUCKETS, registry=theirs)
    for label, value in observations:
        loop.labels(label).observe(value)
        reference.labels(label).observe(value)
    assert exposition(ours) == exposition(theirs)


@given(st.lists(VALUES))
def test_an_unlabelled_histogram_exposes_what_prometheus_client_would(
    values: list[float],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("pidctl_records", "Records.", buckets=BUCKETS, registry=ours)
    reference = Histogram("pidctl_records", "Records.", buckets=BUCKETS, registry=theirs)
    for value in values:
        loop.observe(value)
        reference.observe(value)
    assert exposition(ours) == exposition(theirs)


def test_created_times_are_exported_per_child() -> None:
    registry = CollectorRegistry()
    LoopCounter("pidctl_things", "Things.", ["kind"], registry=registry).labels("a").inc()
    LoopHistogram("pidctl_seconds", "T.", ["api"], buckets=BUCKETS, registry=registry).labels(
        "x"
    ).observe(0.1)
    text = generate_latest(registry).decode()
    assert re.search(r'^pidctl_things_created\{kind="a"\} \d', text, re.M)
    assert re.search(r'^pidctl_seconds_created\{api="x"\} \d', text, re.M)


def test_wrong_label_count_and_duplicate_names_are_refused() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("pidctl_things", "Things.", ["kind"], registry=registry)
    with pytest.raises(ValueError, match="expected labels"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="Duplicated"):
        LoopHistogram("pidctl_things", "Again.", buckets=BUCKETS, registry=registry)
