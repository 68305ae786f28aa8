"""pidctl for PySpark: preallocated producer ids for a job, an exactly-once SQL sink and the
metadata log as a DataFrame. Needs the ``spark`` extra (pyspark 4, pyarrow, psycopg)."""

from __future__ import annotations

from typing import Any

from pidctl.spark.allocation import JobAllocation, PreallocationError, preallocate_producer_ids
from pidctl.spark.columns import with_producer_columns

__all__ = [
    "JobAllocation",
    "PreallocationError",
    "preallocate_producer_ids",
    "register_data_sources",
    "with_producer_columns",
]


def register_data_sources(spark: Any) -> None:
    """Make ``format("pidctl-sql")`` and ``format("pidctl-log")`` known to ``spark``; the
    sink's job blocks then carry the application id as client id by default."""
    from pidctl.spark.allocation import application_id
    from pidctl.spark.logsource import PidctlLogSource
    from pidctl.spark.session import use_this_python_locally
    from pidctl.spark.sink import PidctlSqlSink

    use_this_python_locally(spark)  # before the data sources carry a Python to the workers
    # A subclass made here travels to Spark's Python workers by value, with the id in it.
    sink = type("PidctlSqlSink", (PidctlSqlSink,), {"application_id": application_id(spark)})
    spark.dataSource.register(sink)
    spark.dataSource.register(PidctlLogSource)
