"""A Spark driver for the crash tests: writes rows 0..N-1 through pidctl-sql, as a user's job
would, optionally hanging in every task after some rows are staged (so that the test can
SIGKILL the driver mid-write, never after the write finished).

    python -m tests.ops.spark.crash_driver --bootstrap H:P --url URL --table T --rows N
        [--partitions P] [--batch-size B] [--hang-after K] [--txn-app A --txn-version V]
        [--abandoned-after S]
    python -m tests.ops.spark.crash_driver --stream SOURCE_DIR --checkpoint DIR ...
        (the same through writeStream: JSON files of SOURCE_DIR, one file per micro-batch)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pidctl.spark import register_data_sources
from pidctl.spark.sink import ExactlyOnceWriter, PidctlSqlSink
from pidctl.spark.stream import ExactlyOnceStreamWriter


class HangingWriter(ExactlyOnceWriter):
    """The real writer, in tasks that stop for good after ``hangAfter`` of their rows."""

    def __init__(self, options: dict[str, str], schema: Any) -> None:
        super().__init__(options, schema)
        self.hang_after = int(options.get("hangafter", "0"))

    def rows(self, record_batches: Iterator[Any]) -> Iterator[Any]:
        rows = super().rows(record_batches)
        return _hang_after(rows, self.hang_after) if self.hang_after else rows


def _hang_after(rows: Iterator[Any], count: int) -> Iterator[Any]:
    for index, row in enumerate(rows):
        if index == count:
            threading.Event().wait()  # until the driver is killed
        yield row


class HangingStreamWriter(ExactlyOnceStreamWriter):
    """The real stream writer, whose tasks of micro-batch ``hangInBatch`` stop for good
    after ``hangAfter`` rows."""

    def __init__(self, options: dict[str, str], schema: Any) -> None:
        super().__init__(options, schema)
        self.hang_after = int(options.get("hangafter", "0"))
        self.hang_in_batch = options.get("hanginbatch", "0")

    def rows(self, record_batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        batch = context.getLocalProperty("streaming.sql.batchId")
        rows = super().rows(record_batches)
        if self.hang_after and batch == self.hang_in_batch:
            return _hang_after(rows, self.hang_after)
        return rows


class HangingSink(PidctlSqlSink):
    @classmethod
    def name(cls) -> str:
        return "pidctl-sql-hanging"

    def writer(self, schema: Any, overwrite: bool) -> HangingWriter:
        return HangingWriter(dict(self.options), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> HangingStreamWriter:
        return HangingStreamWriter(dict(self.options), schema)


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--url", "--table"):
        parser.add_argument(name, required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-size", default="100")
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--txn-app")
    parser.add_argument("--txn-version")
    parser.add_argument("--abandoned-after")
    parser.add_argument("--stream", help="a folder of JSON files: write them as a stream")
    parser.add_argument("--checkpoint")
    parser.add_argument("--hang-in-batch", default="0")
    args = parser.parse_args()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pidctl-crash-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    spark.dataSource.register(HangingSink)
    if args.stream:
        stream(spark, args)
        return
    df = spark.range(0, args.rows, 1, args.partitions).selectExpr(
        "id", "concat('row-', id) AS name"
    )
    writer = (
        df.write.format("pidctl-sql-hanging" if args.hang_after else "pidctl-sql")
        .mode("append")
        .option("bootstrap", args.bootstrap)
        .option("url", args.url)
        .option("table", args.table)
        .option("partitions", str(args.partitions))
        .option("batchSize", args.batch_size)
        .option("hangAfter", str(args.hang_after))
    )
    if args.txn_app:
        writer = writer.option("txnAppId", args.txn_app).option("txnVersion", args.txn_version)
    if args.abandoned_after:
        writer = writer.option("abandonedAfterSeconds", args.abandoned_after)
    writer.save()
    print("write finished", flush=True)
    spark.stop()


def stream(spark: Any, args: argparse.Namespace) -> None:
    """Every file of ``args.stream`` once, a file per micro-batch, then stop."""
    query = (
        spark.readStream.schema("id LONG, name STRING")
        .option("maxFilesPerTrigger", 1)
        .json(args.stream)
        .writeStream.format("pidctl-sql-hanging" if args.hang_after else "pidctl-sql")
        .option("checkpointLocation", args.checkpoint)
        .option("bootstrap", args.bootstrap)
        .option("url", args.url)
        .option("table", args.table)
        .option("partitions", str(args.partitions))
        .option("batchSize", args.batch_size)
        .option("hangAfter", str(args.hang_after))
        .option("hangInBatch", args.hang_in_batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("stream finished", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
