"""The sink's batch rules (Kafka's, via ops/broker/sequences.py) and both database stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.postgres import PostgresProcess
from pidctl.spark.sequencing import Decision, SequenceError, StoredProducer, decide
from pidctl.spark.sqlstore import SqlStore, open_store


def test_first_batch_must_start_at_zero() -> None:
    assert decide(None, 7, 0, 0, 10) is Decision.APPEND
    with pytest.raises(SequenceError, match="refusing a gap"):
        decide(None, 7, 0, 10, 10)


def test_next_duplicate_older_duplicate_gap_and_overlap() -> None:
    stored = StoredProducer(epoch=0, last_batch_first_sequence=10, last_sequence=19)
    assert decide(stored, 7, 0, 20, 10) is Decision.APPEND
    assert decide(stored, 7, 0, 10, 10) is Decision.DUPLICATE  # the same batch again
    assert decide(stored, 7, 0, 0, 10) is Decision.DUPLICATE  # an older one
    with pytest.raises(SequenceError, match=r"sequence 30 does not follow .* 19"):
        decide(stored, 7, 0, 30, 10)
    with pytest.raises(SequenceError):
        decide(stored, 7, 0, 15, 10)  # overlaps: batches were cut differently


def test_epochs() -> None:
    stored = StoredProducer(epoch=3, last_batch_first_sequence=0, last_sequence=9)
    with pytest.raises(SequenceError, match="fenced"):
        decide(stored, 7, 2, 10, 10)
    assert decide(stored, 7, 4, 0, 10) is Decision.APPEND  # a bump starts at 0
    with pytest.raises(SequenceError):
        decide(stored, 7, 4, 10, 10)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'sink.db'}"
    else:
        url = request.getfixturevalue("postgres").url
    opened = open_store(url)
    opened.create_tables("t_seq", [("id", opened.types["long"]), ("name", opened.types["string"])])
    yield opened
    opened.execute("DROP TABLE t_seq")
    for table in ("pidctl_producer_state", "pidctl_aborted_ranges", "pidctl_sink_commits"):
        opened.execute(f"DELETE FROM {table}")
    opened.connection.commit()
    opened.close()


def _rows(store: SqlStore) -> list[tuple[int, str, int, int]]:
    cursor = store.execute(
        "SELECT id, name, pidctl_producer_id, pidctl_sequence FROM t_seq ORDER BY id"
    )
    return [tuple(r) for r in cursor.fetchall()]


def test_store_applies_each_batch_once_and_refuses_gaps(store: SqlStore) -> None:
    batch = [(1, "a"), (2, "b")]
    assert store.apply_batch("t_seq", ["id", "name"], 42, 0, 0, batch) is Decision.APPEND
    assert store.apply_batch("t_seq", ["id", "name"], 42, 0, 0, batch) is Decision.DUPLICATE
    with pytest.raises(SequenceError, match="refusing a gap"):
        store.apply_batch("t_seq", ["id", "name"], 42, 0, 5, [(9, "gap")])
    assert store.apply_batch("t_seq", ["id", "name"], 42, 0, 2, [(3, "c")]) is Decision.APPEND
    assert _rows(store) == [(1, "a", 42, 0), (2, "b", 42, 1), (3, "c", 42, 2)]


def test_a_failed_batch_leaves_nothing(store: SqlStore) -> None:
    # The second row has a value too many: the insert fails after the first row went in.
    with pytest.raises(Exception):  # noqa: B017 - each driver has its own error type
        store.apply_batch("t_seq", ["id", "name"], 42, 0, 0, [(1, "a"), (2, "b", "extra")])
    assert _rows(store) == []
    # Neither the rows nor the state moved: the batch can be applied as it should have been.
    assert store.apply_batch("t_seq", ["id", "name"], 42, 0, 0, [(1, "a")]) is Decision.APPEND


def test_abort_deletes_the_jobs_rows_and_fences_late_batches(store: SqlStore) -> None:
    store.apply_batch("t_seq", ["id", "name"], 5000, 0, 0, [(1, "other job")])
    store.apply_batch("t_seq", ["id", "name"], 9001, 0, 0, [(2, "a"), (3, "b")])
    assert store.abort_job("t_seq", "app-1", [(9000, 1000)]) == 2
    assert [r[0] for r in _rows(store)] == [1]
    with pytest.raises(SequenceError, match="job app-1 was aborted"):
        store.apply_batch("t_seq", ["id", "name"], 9001, 0, 2, [(4, "late")])


def test_postgres_fixture_is_real(postgres: PostgresProcess) -> None:
    import psycopg

    with psycopg.connect(postgres.url) as connection:
        version = connection.execute("SHOW server_version").fetchone()
    assert version is not None and int(version[0].split(".")[0]) >= 13
