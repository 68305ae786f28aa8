"""Benchmark of the Spark integration, with baselines measured in the same run.

    python -m ops.bench.spark [--rows 200000] [--partitions 4]

- Driver-side preallocation for 1,000 and 100,000 partitions (ceil(N/1000) AllocateProducerIds
  pipelined over one connection), against the baseline of asking one InitProducerId per
  partition (what tasks would do without the hook; measured for 1,000, one connection).
- The exactly-once sink's throughput (rows/s) on SQLite and PostgreSQL, against a plain
  JDBC-style append of the same rows in the same batches with no sequence checks
  (``PlainAppend`` below: one INSERT per batch, one transaction per batch).
Prints one JSON object. Needs the `spark` extra, Java 17, and Debian's postgresql.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

from ops.testing.postgres import PostgresProcess
from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.protocol import requests
from pidctl.spark.allocation import allocate_job_blocks
from pidctl.spark.sink import batches
from pidctl.spark.sqlstore import open_store


class PlainAppend(DataSource):
    """The baseline sink: rows appended in batches, no producer state, no checks."""

    @classmethod
    def name(cls) -> str:
        return "plain-sql-append"

    def writer(self, schema: Any, overwrite: bool) -> PlainWriter:
        return PlainWriter(dict(self.options), [f.name for f in schema.fields])


class PlainWriter(DataSourceWriter):
    def __init__(self, options: dict[str, str], columns: list[str]) -> None:
        self.url, self.table = options["url"], options["table"]
        self.batch_size = int(options.get("batchsize", "1000"))
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        store = open_store(self.url)
        marks = ", ".join([store.placeholder] * len(self.columns))
        sql = f"INSERT INTO {self.table} ({', '.join(self.columns)}) VALUES ({marks})"
        for batch in batches(iterator, self.batch_size):  # the sink's batches, no checks
            store.begin()
            store.connection.cursor().executemany(sql, batch)
            store.connection.commit()
        store.close()
        assert TaskContext.get() is not None
        return WriterCommitMessage()


def _time(function: Any) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def preallocation(bootstrap: str) -> dict[str, float]:
    out = {}
    for count in (1_000, 100_000):
        out[f"preallocate_{count}_s"] = min(
            _time(lambda c=count: allocate_job_blocks(bootstrap, c, "bench")) for _ in range(3)
        )

    def one_init_each() -> None:
        with SyncClient(bootstrap) as client:
            for _ in range(1000):
                assert client.request(requests.init_producer_id()).error_code == 0

    out["init_producer_id_x1000_s"] = _time(one_init_each)
    out["preallocate_1000_vs_init_each"] = (
        out["preallocate_1000_s"] / out["init_producer_id_x1000_s"]
    )
    return out


def sink_throughput(
    spark: Any, bootstrap: str, url: str, rows: int, partitions: int
) -> dict[str, float]:
    df = spark.range(0, rows, 1, partitions).selectExpr("id", "concat('row-', id) AS name")
    df.cache().count()
    store = open_store(url)
    store.execute("CREATE TABLE IF NOT EXISTS plain_rows (id BIGINT, name TEXT)")
    store.connection.commit()
    store.close()
    out: dict[str, float] = {}
    for _ in range(3):
        for label, sink, table in (
            ("plain", "plain-sql-append", "plain_rows"),
            ("exactly_once", "pidctl-sql", "eo_rows"),
        ):
            writer = df.write.format(sink).mode("append").option("url", url)
            writer = writer.option("table", table).option("bootstrap", bootstrap)
            writer = writer.option("partitions", str(partitions)).option("batchSize", "1000")
            rate = rows / _time(writer.save)
            out[f"{label}_rows_per_s"] = max(rate, out.get(f"{label}_rows_per_s", 0.0))
    out["exactly_once_vs_plain"] = out["exactly_once_rows_per_s"] / out["plain_rows_per_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pidctl.spark import register_data_sources

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pidctl-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    spark.dataSource.register(PlainAppend)
    out: dict[str, Any] = {"rows": args.rows, "partitions": args.partitions}
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp) / "data") as server:
        out["driver"] = preallocation(server.bootstrap)
        out["sqlite"] = sink_throughput(
            spark, server.bootstrap, f"sqlite://{tmp}/bench.db", args.rows, args.partitions
        )
        with PostgresProcess() as postgres:
            out["postgresql"] = sink_throughput(
                spark, server.bootstrap, postgres.url, args.rows, args.partitions
            )
    spark.stop()
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
