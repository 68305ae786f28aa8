"""The job ``python -m ops.bench.spark --cluster`` submits to a standalone cluster: the same
DataFrame written by Spark's own JDBC sink (``df.write.jdbc``) as a data team calls it
(``jdbc``), by the same sink with the JDBC driver setting ``write_sql`` uses
(``jdbc_rewrite``: ``reWriteBatchedInserts=true``), and by pidctl's (``write_sql``), in
turns, several rounds, each run timed with the CPU of the executors, PostgreSQL and the
driver. Prints one JSON object per run.

    spark-submit --master spark://... --jars /usr/share/java/postgresql.jar \\
        ops/bench/spark_jdbc_job.py --url postgresql://... --bootstrap H:P \\
        --rows 1000000 --partitions 8 --rounds 3 --executor-groups G1,G2 --postgres-pid P
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script by spark-submit, its own folder comes first on sys.path, where
# ops/bench/profile.py would shadow the standard library's profile (which pyspark imports).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402


def _stat(pid: int | str) -> list[str]:
    # /proc/PID/stat after the command (which may hold spaces): state is [0], pgrp [2],
    # utime, stime, cutime, cstime [11:15].
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def process_cpu_seconds(pid: int) -> float:
    """CPU a process and its children that it has waited for (PostgreSQL's backends, once
    they exit) have used, in seconds; 0 for pid 0."""
    if not pid:
        return 0.0
    return sum(int(v) for v in _stat(pid)[11:15]) / os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(groups: list[int]) -> float:
    """The same, summed over every live process of the process ``groups`` (the cluster's
    workers, their executors and Python workers)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat(stat.parent.name)
        except OSError:  # exited meanwhile
            continue
        if int(fields[2]) in groups:
            total += sum(int(v) for v in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


#: What each round writes: ``id`` and a label, as the issue's job did.
JDBC_TABLE = "jdbc_rows"
JDBC_REWRITE_TABLE = "jdbc_rewrite_rows"
PIDCTL_TABLE = "pidctl_rows"
TABLES = (JDBC_TABLE, JDBC_REWRITE_TABLE, PIDCTL_TABLE)


def _reset(url: str) -> None:
    """Empty both tables and checkpoint, so no run pays for the previous one's WAL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        for table in TABLES:
            connection.execute(f"TRUNCATE {table}")
        connection.execute("CHECKPOINT")


def _count(url: str, table: str) -> int:
    import psycopg

    with psycopg.connect(url) as connection:
        row = connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="postgresql://...")
    parser.add_argument("--bootstrap", required=True, help="pidctl's HOST:PORT")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--executor-groups", default="", help="process groups of the workers")
    parser.add_argument("--postgres-pid", type=int, default=0, help="the postmaster")
    parser.add_argument(
        "--sinks", default="jdbc,jdbc_rewrite,pidctl_sql", help="which of the three to run"
    )
    args = parser.parse_args()

    import psycopg
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pidctl.spark import write_sql
    from pidctl.spark.write import jdbc_location

    spark = SparkSession.builder.appName("pidctl-bench-jdbc").getOrCreate()
    df = spark.range(0, args.rows, 1, args.partitions).withColumn(
        "label", F.concat(F.lit("row-"), F.col("id").cast("string"))
    )
    jdbc_url, properties = jdbc_location(args.url)
    properties["driver"] = "org.postgresql.Driver"
    rewrite_properties = {**properties, "reWriteBatchedInserts": "true"}
    with psycopg.connect(args.url, autocommit=True) as connection:
        for table in (JDBC_TABLE, JDBC_REWRITE_TABLE):
            connection.execute(f"CREATE TABLE IF NOT EXISTS {table} (id BIGINT, label TEXT)")
    # A first small write of each: the table write_sql appends to (and its sink tables), and
    # the executors' JDBC classes loaded, so that no sink's first run pays for them.
    write_sql(df.limit(1), bootstrap=args.bootstrap, url=args.url, table=PIDCTL_TABLE)
    df.limit(1).write.jdbc(jdbc_url, JDBC_TABLE, "append", properties)
    df.limit(1).write.jdbc(jdbc_url, JDBC_REWRITE_TABLE, "append", rewrite_properties)
    groups = [int(g) for g in args.executor_groups.split(",") if g]

    def run(name: str, write: Callable[[], Any], table: str, index: int) -> None:
        _reset(args.url)
        cpu = (
            group_cpu_seconds(groups),
            process_cpu_seconds(args.postgres_pid),
            group_cpu_seconds([os.getpgrp()]),
        )
        started = time.perf_counter()
        write()
        seconds = time.perf_counter() - started
        after = (
            group_cpu_seconds(groups),
            process_cpu_seconds(args.postgres_pid),
            group_cpu_seconds([os.getpgrp()]),
        )
        assert _count(args.url, table) == args.rows, f"{name} wrote a wrong number of rows"
        used = {
            k: round(b - a, 2)
            for k, a, b in zip(("executors", "postgres", "driver"), cpu, after, strict=True)
        }
        print(
            json.dumps(
                {
                    "round": index,
                    "sink": name,
                    "rows": args.rows,
                    "partitions": args.partitions,
                    "seconds": round(seconds, 2),
                    "cpu_s": used,
                }
            ),
            flush=True,
        )

    def jdbc() -> None:
        df.write.jdbc(jdbc_url, JDBC_TABLE, "append", properties)

    def jdbc_rewrite() -> None:
        df.write.jdbc(jdbc_url, JDBC_REWRITE_TABLE, "append", rewrite_properties)

    def pidctl() -> None:
        write_sql(df, bootstrap=args.bootstrap, url=args.url, table=PIDCTL_TABLE)

    chosen = args.sinks.split(",")
    sinks = [
        sink
        for sink in [
            ("jdbc", jdbc, JDBC_TABLE),
            ("jdbc_rewrite", jdbc_rewrite, JDBC_REWRITE_TABLE),
            ("pidctl_sql", pidctl, PIDCTL_TABLE),
        ]
        if sink[0] in chosen
    ]
    for index in range(args.rounds):
        # In turns: each sink runs first, second and third in three rounds.
        turn = index % len(sinks)
        for name, write, table in sinks[turn:] + sinks[:turn]:
            run(name, write, table, index)
    spark.stop()


if __name__ == "__main__":
    main()
