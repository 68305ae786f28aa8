"""The fault harness's own checks, before it starts anything (its faults run in
tests/ops/spark/test_kafka_on_cluster.py, on a real cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from ops.testing.spark_kafka_faults import BATCH_ROWS, KafkaFaults, min_rows


def test_too_few_rows_for_a_fault_mid_task_are_refused_before_anything_runs() -> None:
    """Each task must write two batches for a fault to land between them: the harness
    refuses fewer rows for its partitions before it builds or starts anything (nothing is
    given to it here to start)."""
    nothing: Any = None
    assert min_rows(8) == 2 * BATCH_ROWS * 8
    with pytest.raises(ValueError, match="8000 at least"):
        KafkaFaults(nothing, nothing, nothing, rows=min_rows(8) - 1, partitions=8)
    with pytest.raises(ValueError, match="4000 at least"):
        KafkaFaults(nothing, nothing, nothing, rows=min_rows() - 1)
