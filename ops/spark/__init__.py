"""pidctl for PySpark: preallocated producer ids for a job, an exactly-once SQL sink
(``write_sql`` for batch jobs, ``format("pidctl-sql")`` for streams), an exactly-once Kafka
sink (``format("pidctl-kafka")``, ``write_kafka``) and the metadata log as a DataFrame. Needs
the ``spark`` extra (pyspark 4, pyarrow, psycopg)."""

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
    "write_kafka",
    "write_sql",
]


def write_sql(df: Any, options: Any = None, /, **named: Any) -> Any:
    """The exactly-once SQL sink for a batch job: :func:`pidctl.spark.write.write_sql`."""
    from pidctl.spark.write import write_sql as write

    return write(df, options, **named)


def write_kafka(df: Any, options: Any = None, /, **named: Any) -> Any:
    """Spark to Kafka exactly once for a batch job, decided on the driver:
    :func:`pidctl.spark.kafka_write.write_kafka`."""
    from pidctl.spark.kafka_write import write_kafka as write

    return write(df, options, **named)


def register_data_sources(spark: Any) -> None:
    """Make ``format("pidctl-sql")``, ``format("pidctl-kafka")`` and ``format("pidctl-log")``
    known to ``spark``; the sinks' job blocks then carry the application id as client id by
    default."""
    from pidctl.spark.allocation import application_id
    from pidctl.spark.kafka_sink import PidctlKafkaSink
    from pidctl.spark.logsource import PidctlLogSource
    from pidctl.spark.session import use_this_python_locally
    from pidctl.spark.sink import PidctlSqlSink

    use_this_python_locally(spark)  # before the data sources carry a Python to the workers
    # A subclass made here travels to Spark's Python workers by value, with the id in it.
    app = {"application_id": application_id(spark)}
    spark.dataSource.register(type("PidctlSqlSink", (PidctlSqlSink,), app))
    spark.dataSource.register(type("PidctlKafkaSink", (PidctlKafkaSink,), app))
    spark.dataSource.register(PidctlLogSource)
