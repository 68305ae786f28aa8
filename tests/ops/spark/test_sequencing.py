"""The sink's batch rules: Kafka's, via ops/broker/sequences.py."""

from __future__ import annotations

import pytest

from ops.testing.postgres import PostgresProcess
from pidctl.spark.sequencing import Decision, SequenceError, StoredProducer, decide


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


def test_postgres_fixture_is_real(postgres: PostgresProcess) -> None:
    import psycopg

    with psycopg.connect(postgres.url) as connection:
        version = connection.execute("SHOW server_version").fetchone()
    assert version is not None and int(version[0].split(".")[0]) >= 13
