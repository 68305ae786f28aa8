"""A report on producer-id use, in Spark SQL over pidctl's metadata log.

    python -m pidctl.spark.examples.pid_report DATA_DIR

Answers, for operators: which holder (broker, job, the controller's own pool) received how
many PIDs per hour, who asked for them, and when the range runs out at the rate of the last
day. Needs the `spark` extra and Java 17; runs a local SparkSession.
"""

from __future__ import annotations

import os
import sys

# Spark's Python workers must run this interpreter (where pidctl is installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession

from pidctl.controller.core.kafka import INT64_MAX
from pidctl.spark import register_data_sources


def main(data_dir: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pidctl-report")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    spark.read.format("pidctl-log").load(data_dir).createOrReplaceTempView("pidctl_log")

    print("# PIDs granted per holder per hour")
    spark.sql("""
        SELECT date_trunc('hour', timestamp) AS hour,
               holder,
               CASE WHEN holder = 'job' THEN client_id ELSE CAST(broker_id AS STRING) END AS who,
               COUNT(*) AS blocks,
               SUM(next_producer_id - first_producer_id) AS pids
        FROM pidctl_log WHERE type = 'ProducerIdsGranted'
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    """).show(50, truncate=False)

    print("# Principals and client ids that asked for blocks")
    spark.sql("""
        SELECT principal, client_id, COUNT(*) AS blocks FROM pidctl_log
        WHERE type = 'ProducerIdsGranted' GROUP BY 1, 2 ORDER BY blocks DESC
    """).show(20, truncate=False)

    print("# When does the range run out?")
    spark.sql(f"""
        WITH grants AS (
            SELECT timestamp, next_producer_id FROM pidctl_log WHERE type = 'ProducerIdsGranted'
        ), recent AS (
            SELECT MAX(next_producer_id) - MIN(next_producer_id) AS pids,
                   (unix_millis(MAX(timestamp)) - unix_millis(MIN(timestamp))) / 1000.0 AS secs
            FROM grants
            WHERE timestamp >= (SELECT MAX(timestamp) FROM grants) - INTERVAL 1 DAY
        )
        SELECT (SELECT MAX(next_producer_id) FROM grants) AS high_water_mark,
               {INT64_MAX} - (SELECT MAX(next_producer_id) FROM grants) AS remaining,
               rate AS pids_per_second_last_day,
               ({INT64_MAX} - (SELECT MAX(next_producer_id) FROM grants)) / rate
                   / 86400 / 365.25 AS years_left
        FROM (
            -- No rate (NULL) from a single grant, or grants all in one millisecond: Spark's
            -- ANSI mode fails a division by zero (DIVIDE_BY_ZERO) rather than give NULL.
            SELECT CASE WHEN secs > 0 AND pids > 0 THEN pids / secs END AS rate FROM recent
        )
    """).show(truncate=False)
    spark.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m pidctl.spark.examples.pid_report DATA_DIR")
    main(sys.argv[1])
