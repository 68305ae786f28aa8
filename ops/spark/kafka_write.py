"""``write_kafka(df, ...)``: ``format("pidctl-kafka")`` for a batch job, run on the driver, with
the one check a data source cannot make: that a re-run's rows are the ones its first run
wrote, for every task, before any task writes.

    result = write_kafka(
        events,
        **{"kafka.bootstrap.servers": "broker:9092", "topic": "events",
           "pidctl.bootstrap": "127.0.0.1:9093", "txnAppId": "nightly", "txnVersion": 7},
    )
    print(result.state, result.rows, result.written, result.present)

The options are the data source's (``kafka_options.py``). On the driver, before any task:
the version's blocks from pidctl — a version that completed before returns at once
(``state == "skipped"``), no Spark job run — and the checks of ``kafka_driver.plan_write``.
A re-run of a version whose PIDs wrote already (its first run failed, or its driver died)
first runs a **check job**: every Spark partition whose PID wrote rows reads its input up to
where the PID's rows end, and compares their fingerprint with the one stamped on the last
batch written; any difference — another data set, a non-deterministic input, another
partitioning — stops the write with :class:`~pidctl.spark.kafka_producer.RowsDiffer`, before
any row is sent. A task of the write itself checks its own rows again (as the data source's
do). Then the write — by the JVM carrier when it is on Spark's class path (``carrier.py``: Spark's
JVM tasks carry the rows, as Spark's JDBC writer carries ``write_sql``'s), else by a
``mapInArrow`` job of Python tasks; either way the tasks' reports come back to the driver —
the commit at pidctl, and a :class:`~pidctl.spark.kafka_driver.WriteSummary`: rows written and
found written, per Kafka partition, also logged at WARNING.

``format("pidctl-kafka")`` makes the same per-task check, but its driver (``writer()``, in a
process of its own without the DataFrame) cannot run the check job: a re-run's task whose
PID wrote nothing does not wait for the others' checks (docs/spark-kafka.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from pidctl.spark import carrier
from pidctl.spark import kafka_driver as driver
from pidctl.spark.allocation import application_id
from pidctl.spark.kafka_driver import WritePlan, WriteSummary
from pidctl.spark.kafka_options import KafkaSinkOptionError, KafkaSinkOptions

log = logging.getLogger("pidctl.spark")

#: What the check job and the write job return per task.
_REPORT_SCHEMA = "spark_partition INT, report STRING"


def write_kafka(df: Any, options: dict[str, Any] | None = None, /, **named: Any) -> WriteSummary:
    """Write ``df`` to Kafka exactly once (module doc); options as a dict and/or keywords."""
    from pidctl.spark.kafka_sink import check_columns
    from pidctl.spark.session import use_this_python_locally

    raw = {str(k): str(v) for k, v in {**(options or {}), **named}.items()}
    spark = df.sparkSession
    use_this_python_locally(spark)
    o = KafkaSinkOptions.parse(raw, application_id(spark))
    check_columns(df.schema, o.topic)
    count = df.rdd.getNumPartitions()
    if "partitions" in {k.lower() for k in raw} and o.partitions < count:
        raise KafkaSinkOptionError(
            f"option partitions ({o.partitions}) is below the DataFrame's {count} partitions"
        )
    budget = o.producer.delivery_timeout_s
    expiration = driver.broker_expiration(o)
    if o.app_id is not None and o.app_version is not None:
        blocks = driver.allocate_named(
            o.pidctl_bootstrap,
            max(count, 1),
            o.app_id,
            o.app_version,
            max_age_ms=expiration,
            budget_s=budget,
            connection=o.pidctl_connection,
        )
        if blocks.committed:
            summary = WriteSummary(o.app_id, o.app_version, "skipped", 0, 0, 0, ())
            log.warning(summary.line())
            return summary
        allocation = blocks.allocation
    else:
        allocation = driver.allocate_unnamed(
            o.pidctl_bootstrap,
            max(count, 1),
            o.client_id,
            budget_s=budget,
            connection=o.pidctl_connection,
        )
    topics = [o.topic] if o.topic is not None else []
    plan = driver.plan_write(
        o, allocation, fresh=o.app_id is None, expiration=expiration, topics=topics
    )
    if plan.expected:
        problems = [
            row.report
            for row in df.mapInArrow(_checker(o, allocation, plan), _REPORT_SCHEMA).collect()
            if row.report
        ]
        if problems:
            from pidctl.spark.kafka_producer import RowsDiffer

            raise RowsDiffer(
                f"nothing written: {len(problems)} of the re-run's partitions differ from what "
                f"the version's first run wrote: {problems[0]}"
            )
    name = None if o.app_id is None or o.app_version is None else (o.app_id, o.app_version)
    if carrier.available(spark) and carrier.usable(o):
        written = carrier.write(df, *carrier.plan_json(o, allocation, plan, name))
    else:
        if carrier.usable(o):
            log.warning(
                "pidctl-kafka: the JVM carrier is not on Spark's class path (spark-submit --jars "
                '"$(python -m pidctl.spark.carrier)"): the rows are written from Python tasks'
            )
        rows = df.mapInArrow(_writer(o, allocation, plan, name), _REPORT_SCHEMA).collect()
        written = [json.loads(row.report) for row in rows]
    if name is not None:
        driver.commit_version(
            o.pidctl_bootstrap, *name, budget_s=budget, connection=o.pidctl_connection
        )
    summary = driver.summarize((_report(fields) for fields in written), o.app_id, o.app_version)
    log.warning(summary.line())
    return summary


def _report(fields: dict[str, Any]) -> Any:
    from pidctl.spark.kafka_producer import PartitionReport

    return PartitionReport(**fields)


def _checker(o: KafkaSinkOptions, allocation: Any, plan: WritePlan) -> Any:
    """The check job's function: a partition whose PID wrote compares its rows with what
    was written (up to where that ends), and returns what differs, if anything."""

    def check(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        from pidctl.spark.kafka_producer import RowsDiffer, TaskProducer

        context = TaskContext.get()
        assert context is not None
        partition = context.partitionId()
        problem = ""
        expected = plan.expected.get(partition)
        if expected:
            producer_id, epoch = allocation.producer(partition)
            cluster = o.cluster()
            producer = TaskProducer(
                cluster,
                producer_id,
                epoch,
                partition,
                o.producer,
                resume=False,
                partitions=plan.partitions,
                dry_run=True,
            )
            try:
                for topic, index, sequence, fingerprint in expected:
                    producer.expect((topic, index), sequence, fingerprint)
                for batch in batches:
                    producer.add(batch, o.topic)
                    if producer.checked:
                        break
                if not producer.checked:
                    producer.close()  # raises: rows the PID wrote that this run lacks
            except RowsDiffer as e:
                problem = f"Spark partition {partition}: {e}"
            finally:
                cluster.close()
        yield pa.RecordBatch.from_pylist(
            [{"spark_partition": partition, "report": problem}],
            schema=pa.schema([("spark_partition", pa.int32()), ("report", pa.string())]),
        )

    return check


def _writer(
    o: KafkaSinkOptions, allocation: Any, plan: WritePlan, name: tuple[str, int] | None
) -> Any:
    """The write job's function: the data source's task (``kafka_sink.write_partition``),
    its reports returned as JSON."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from pidctl.spark.kafka_sink import write_partition

        done = write_partition(o, allocation, plan, batches, name=name)
        rows = [
            {
                "spark_partition": done.spark_partition,
                "report": json.dumps(
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "rows": r.rows,
                        "written": r.written,
                        "skipped": r.skipped,
                        "last_sequence": r.last_sequence,
                    }
                ),
            }
            for r in done.partitions
        ]
        yield pa.RecordBatch.from_pylist(
            rows, schema=pa.schema([("spark_partition", pa.int32()), ("report", pa.string())])
        )

    return write
