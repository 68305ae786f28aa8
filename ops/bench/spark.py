"""Benchmark of the Spark integration, with baselines measured in the same run.

    python -m ops.bench.spark [--rows 200000] [--partitions 4]
    python -m ops.bench.spark --cluster [--rows 1000000] [--partitions 8] [--rounds 3]

- ``--cluster``: the sink against Spark's own JDBC sink (``df.write.jdbc``, PostgreSQL's JDBC
  driver), the issue's job: a standalone master with two workers (one core, 1 GiB each),
  PostgreSQL, the same DataFrame (``id``, a label) written by each, alternately, ``--rounds``
  rounds; per round the times, the ratio (JDBC's time / pidctl-sql's: pidctl-sql's
  throughput relative to JDBC's) and the CPU seconds of the executors, PostgreSQL and the
  driver during each run. Goal: at least 0.8x (and a 10,000-partition job within 1.5x of
  JDBC's time: ``--partitions 10000``). A second baseline, ``df.write.jdbc`` with
  ``reWriteBatchedInserts=true`` (the JDBC driver setting ``write_sql`` uses), gives
  ``ratio_to_rewrite``; ``--untuned-only`` leaves it out. Needs Debian's
  libpostgresql-jdbc-java.

- Driver-side preallocation for 1,000 and 100,000 partitions (ceil(N/1000) AllocateProducerIds
  pipelined over one connection), against the baseline of asking one InitProducerId per
  partition (what tasks would do without the hook; measured for 1,000, one connection).
- The exactly-once sink's throughput (rows/s) on SQLite and PostgreSQL — staged, checked and
  published atomically — against a plain JDBC-style append of the same rows in the same
  batches with no sequence checks and no staging (``PlainAppend`` below: one INSERT per
  batch, one transaction per batch). Goal: at least 0.8x.
- The streaming sink (``writeStream.format("pidctl-sql")``, a micro-batch per JSON file)
  against Spark's own ``foreachBatch`` appending each micro-batch with ``PlainAppend``.
Prints one JSON object. Needs the `spark` extra, Java 17, and Debian's postgresql.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage

from ops.bench.common import ROOT
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


def stream_source(folder: Path, rows: int, files: int) -> Path:
    """``rows`` rows as ``files`` JSON files: one micro-batch each."""
    folder.mkdir()
    per_file = rows // files
    for index in range(files):
        first = index * per_file
        lines = (f'{{"id": {i}, "name": "row-{i}"}}' for i in range(first, first + per_file))
        (folder / f"part-{index}.json").write_text("\n".join(lines) + "\n")
    return folder


def stream_throughput(
    spark: Any, bootstrap: str, url: str, source: Path, rows: int, tmp: Path
) -> dict[str, float]:
    """Rows/s of a whole availableNow query over ``source``: the pidctl-sql stream writer
    against foreachBatch with a plain append; best of three, the two interleaved."""
    store = open_store(url)
    store.execute("CREATE TABLE IF NOT EXISTS plain_stream (id BIGINT, name TEXT)")
    store.connection.commit()
    store.close()
    options = {"url": url, "bootstrap": bootstrap, "partitions": "16", "batchSize": "1000"}

    def plain_append(batch: Any, _: int) -> None:
        writer = batch.write.format("plain-sql-append").mode("append")
        writer.option("url", url).option("table", "plain_stream").option("batchSize", "1000")
        writer.save()

    out: dict[str, float] = {}
    for attempt in range(3):
        for label in ("foreach_batch", "exactly_once"):
            reader = spark.readStream.schema("id LONG, name STRING")
            stream = reader.option("maxFilesPerTrigger", 1).json(str(source)).writeStream
            checkpoint = tmp / f"checkpoint-{store.dialect}-{label}-{attempt}"
            stream = stream.option("checkpointLocation", str(checkpoint))
            if label == "foreach_batch":
                stream = stream.foreachBatch(plain_append)
            else:
                stream = stream.format("pidctl-sql").option("table", "eo_stream")
                for name, value in options.items():
                    stream = stream.option(name, value)
            query = stream.trigger(availableNow=True).start()
            rate = rows / _time(query.awaitTermination)
            assert query.exception() is None, query.exception()
            out[f"{label}_rows_per_s"] = max(rate, out.get(f"{label}_rows_per_s", 0.0))
    out["exactly_once_vs_foreach_batch"] = (
        out["exactly_once_rows_per_s"] / out["foreach_batch_rows_per_s"]
    )
    return out


#: Where Debian's libpostgresql-jdbc-java puts PostgreSQL's JDBC driver.
POSTGRES_JDBC_JAR = "/usr/share/java/postgresql.jar"


def jdbc_job_options() -> list[str]:
    """``spark-submit`` options of a job writing with Spark's JDBC writer on a small cluster:
    executors of 512 MiB, warnings only, this Python, PostgreSQL's JDBC driver."""
    return [
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.log.level=WARN",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--jars",
        POSTGRES_JDBC_JAR,
    ]


def against_jdbc(
    rows: int, partitions: int, rounds: int, workers: int = 2, tuned: bool = True
) -> dict[str, Any]:
    """pidctl-sql (``write_sql``) against ``df.write.jdbc`` on a standalone cluster of its own
    (``workers`` workers of one core and 1 GiB), PostgreSQL and pidctl: :func:`jdbc_rounds`."""
    from ops.testing.spark_cluster import SparkCluster

    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(Path(tmp) / "data") as server,
        PostgresProcess() as postgres,
        SparkCluster(workers=workers) as cluster,
    ):
        return jdbc_rounds(cluster, postgres, server.bootstrap, rows, partitions, rounds, tuned)


#: The baselines, by the name the job prints: Spark's JDBC sink as a data team calls it, and
#: with the JDBC driver setting ``write_sql`` uses (``reWriteBatchedInserts=true``).
BASELINES = {"jdbc": "ratio", "jdbc_rewrite": "ratio_to_rewrite"}


def jdbc_rounds(
    cluster: Any,
    postgres: PostgresProcess,
    bootstrap: str,
    rows: int,
    partitions: int,
    rounds: int,
    tuned: bool = True,
) -> dict[str, Any]:
    """Submit ops/bench/spark_jdbc_job.py to ``cluster``; per round each run's time and CPU
    seconds, and the ratio of each baseline's time to pidctl-sql's (``ratio``: against
    ``df.write.jdbc`` as called by default, the issue's goal; ``ratio_to_rewrite``: against
    it with ``reWriteBatchedInserts=true``, unless not ``tuned``)."""
    import statistics

    baselines = [name for name in BASELINES if tuned or name == "jdbc"]
    postmaster = int((postgres.directory / "data" / "postmaster.pid").read_text().split()[0])
    command = [
        *cluster.submit_command(),
        *jdbc_job_options(),
        str(ROOT / "ops" / "bench" / "spark_jdbc_job.py"),
        "--url",
        postgres.new_database(),
        "--bootstrap",
        bootstrap,
        "--rows",
        str(rows),
        "--partitions",
        str(partitions),
        "--rounds",
        str(rounds),
        "--executor-groups",
        ",".join(map(str, cluster.process_groups()[1:])),
        "--postgres-pid",
        str(postmaster),
        "--sinks",
        ",".join([*baselines, "pidctl_sql"]),
    ]
    done = subprocess.run(
        command,
        env=cluster.submit_env(PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        start_new_session=True,  # the driver's CPU: its own process group
    )
    if done.returncode:
        raise RuntimeError(
            f"the benchmark job failed: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    per_round = []
    for index in range(rounds):
        by_sink = {run["sink"]: run for run in runs if run["round"] == index}
        pidctl = by_sink["pidctl_sql"]
        one: dict[str, Any] = {"pidctl_sql_s": pidctl["seconds"]}
        for name in baselines:
            one[f"{name}_s"] = by_sink[name]["seconds"]
            one[BASELINES[name]] = round(by_sink[name]["seconds"] / pidctl["seconds"], 3)
        one["cpu_s"] = {name: run["cpu_s"] for name, run in by_sink.items()}
        per_round.append(one)
    return {
        "rows": rows,
        "partitions": partitions,
        "workers": len(cluster.process_groups()) - 1,
        "rounds": per_round,
        **{
            f"median_{BASELINES[name]}": statistics.median(r[BASELINES[name]] for r in per_round)
            for name in baselines
        },
        "load_average": [round(load, 2) for load in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--stream-files", type=int, default=4, help="micro-batches")
    parser.add_argument("--cluster", action="store_true", help="against df.write.jdbc")
    parser.add_argument("--rounds", type=int, default=3, help="--cluster: rounds")
    parser.add_argument(
        "--untuned-only",
        action="store_true",
        help="--cluster: leave out the baseline with reWriteBatchedInserts (a long job)",
    )
    args = parser.parse_args()
    if args.cluster:
        result = against_jdbc(args.rows, args.partitions, args.rounds, tuned=not args.untuned_only)
        json.dump(result, sys.stdout, indent=2)
        print()
        return
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
        source = stream_source(Path(tmp) / "stream-in", args.rows, args.stream_files)
        out["sqlite_stream"] = stream_throughput(
            spark, server.bootstrap, f"sqlite://{tmp}/stream.db", source, args.rows, Path(tmp)
        )
        with PostgresProcess() as postgres:
            out["postgresql"] = sink_throughput(
                spark, server.bootstrap, postgres.url, args.rows, args.partitions
            )
            out["postgresql_stream"] = stream_throughput(
                spark, server.bootstrap, postgres.url, source, args.rows, Path(tmp)
            )
    spark.stop()
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
