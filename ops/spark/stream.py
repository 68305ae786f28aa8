"""``df.writeStream.format("pidctl-sql")``: the sink for Structured Streaming, exactly once per
micro-batch across query restarts and driver crashes.

    (df.writeStream.format("pidctl-sql")
       .option("bootstrap", "127.0.0.1:9093").option("url", "...").option("table", "events")
       .option("checkpointLocation", "/checkpoints/events")
       .start())

Each micro-batch is one write of :mod:`pidctl.spark.sink` — staged by the tasks, published
by ``commit()`` in one transaction — with the query id as ``txnAppId`` and the batch id as
``txnVersion``. Spark replays a micro-batch after a restart when its commit did not reach
the checkpoint: if the sink had published it, the replay writes nothing; if not, the replay
replaces the crashed attempt's staged rows.

What Spark 4's Python API gives and lacks: ``DataSourceStreamWriter.commit`` and ``abort``
receive the batch id but not the query id, and ``streamWriter()`` (which Spark calls on the
driver for every micro-batch, more than once) receives neither. The tasks read both from
Spark's task-local properties (``sql.streaming.queryId``, ``streaming.sql.batchId``) and
register the write themselves (idempotently); the commit learns the write from their
reports. A micro-batch none of whose tasks reported (no partitions) writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pidctl.spark.sink import (
    SinkCommit,
    SinkOptionError,
    SinkOptions,
    abort,
    arrow_batches_as_rows,
    prepare_table,
    publish,
    stage_partition,
)
from pidctl.spark.sqlstore import Write, WriteState, open_store

#: Spark's task-local properties naming a streaming query (stable across restarts from the
#: checkpoint) and the micro-batch a task belongs to.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class ExactlyOnceStreamWriter(DataSourceStreamArrowWriter):
    """Built on the driver for a micro-batch (tables, recovery, producer ids), pickled to
    every task of it."""

    def __init__(
        self, options: dict[str, str], schema: StructType, default_client_id: str | None = None
    ) -> None:
        self.options = SinkOptions.parse(options, default_client_id)
        if self.options.app_id is not None:
            raise SinkOptionError(
                "a stream's writes are named by its query id and batch id: "
                "txnAppId/txnVersion apply to batch writes only"
            )
        self.columns = prepare_table(self.options, schema)
        self.allocation = self.options.allocate()

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if query_id is None or batch_id is None:
            raise RuntimeError("pidctl-sql's stream writer runs only in a streaming query")
        partition = context.partitionId()
        # One name per micro-batch and run of the query: a replay after a restart has new
        # producer ids, so it is a new write that supersedes or skips the earlier one.
        first_producer_id = self.allocation.blocks[0][0]
        write = Write(
            f"{query_id}/{batch_id}/{first_producer_id}",
            self.options.table,
            self.options.job,
            query_id,
            int(batch_id),
        )
        store = open_store(self.options.url)
        try:
            outcome = store.begin_write(write)
            if outcome.state is not WriteState.OPEN:
                for _ in iterator:  # already published by an earlier run: read, write nothing
                    pass
                return SinkCommit(None)
            report = stage_partition(
                store,
                write.write_id,
                self.options,
                self.columns,
                partition,
                self.allocation.producer(partition),
                self.rows(iterator),
            )
        finally:
            store.close()
        return SinkCommit(report)

    def rows(self, record_batches: Iterator[Any]) -> Iterator[Any]:
        """A task's rows from Spark's Arrow batches, converted by the type map."""
        return arrow_batches_as_rows(record_batches, self.columns)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        reports = [m.report for m in messages if isinstance(m, SinkCommit) and m.report]
        if reports:
            publish(self.options, self.columns, reports[0].write_id, list(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        write_ids = {m.report.write_id for m in messages if isinstance(m, SinkCommit) and m.report}
        for write_id in write_ids:
            abort(self.options, write_id, f"micro-batch {batchId} failed")
