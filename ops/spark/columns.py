"""``with_producer_columns``: each row's (producer id, epoch, sequence), derived in the task.

Partition p gets the allocation's p-th producer id and its epoch; sequences count the
partition's rows from 0. Nothing depends on the attempt number, so a retried attempt of a
partition reproduces exactly the same triples (given the same rows in the same order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pidctl.spark.allocation import JobAllocation


def with_producer_columns(df: Any, allocation: JobAllocation) -> Any:
    """``df`` with ``producer_id`` (long), ``producer_epoch`` (short) and ``sequence`` (int)
    added, computed with Arrow batches in the tasks; no task contacts the controller."""
    import pyarrow as pa
    from pyspark.sql.types import IntegerType, LongType, ShortType, StructField, StructType

    from pidctl.spark.session import use_this_python_locally

    use_this_python_locally(df.sparkSession)

    schema = StructType(
        [
            *df.schema.fields,
            StructField("producer_id", LongType(), False),
            StructField("producer_epoch", ShortType(), False),
            StructField("sequence", IntegerType(), False),
        ]
    )

    def add_columns(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        producer_id, epoch = allocation.producer(context.partitionId())
        sequence = 0
        for batch in batches:
            rows = batch.num_rows
            batch = batch.append_column("producer_id", pa.array([producer_id] * rows, pa.int64()))
            batch = batch.append_column("producer_epoch", pa.array([epoch] * rows, pa.int16()))
            sequence_column = pa.array(range(sequence, sequence + rows), pa.int32())
            yield batch.append_column("sequence", sequence_column)
            sequence += rows

    return df.mapInArrow(add_columns, schema)
