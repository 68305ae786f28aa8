"""pidctl for PySpark: preallocated producer ids for a job, an exactly-once SQL sink and the
metadata log as a DataFrame. Needs the ``spark`` extra (pyspark 4, pyarrow, psycopg)."""

from __future__ import annotations

from typing import Any

from .allocation import JobAllocation, PreallocationError, preallocate_producer_ids
from .columns import with_producer_columns

__all__ = [
    "JobAllocation",
    "PreallocationError",
    "preallocate_producer_ids",
    "register_data_sources",
    "with_producer_columns",
]


def register_data_sources(spark: Any) -> None:
    """Make ``format("pidctl-sql")`` and ``format("pidctl-log")`` known to ``spark``."""
    from .logsource import PidctlLogSource
    from .sink import PidctlSqlSink

    spark.dataSource.register(PidctlSqlSink)
    spark.dataSource.register(PidctlLogSource)
