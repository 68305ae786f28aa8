"""Write a DataFrame through the exactly-once sink, as a job submitted to a Spark cluster.

    spark-submit --master spark://HOST:7077 [--py-files pidctl.zip] cluster_write.py \\
        --bootstrap 127.0.0.1:9093 --url /shared/orders.db --table orders --rows 5000

The master comes from ``spark-submit``; the rows are ``id`` 0..ROWS-1 with a label, in
``--partitions`` partitions. The executors' Python must be able to import pidctl: ship it
with ``--py-files`` or install the wheel where ``PYSPARK_PYTHON`` points on every worker
(docs/spark-deployment.md). Prints one line: the rows and partitions written.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pidctl.spark import register_data_sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="pidctl's HOST:PORT")
    parser.add_argument("--url", required=True, help="SQLite path or postgresql://...")
    parser.add_argument("--table", required=True, help="the table the rows go to")
    parser.add_argument("--rows", type=int, default=5000, help="how many rows (default 5000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    args = parser.parse_args()
    if args.rows < 0 or args.partitions <= 0:
        parser.error("--rows must be >= 0 and --partitions > 0")

    spark = SparkSession.builder.appName("pidctl-cluster-write").getOrCreate()
    register_data_sources(spark)  # format("pidctl-sql")
    # range() gives every partition the same rows in the same order on every attempt.
    df = spark.range(0, args.rows, 1, args.partitions).withColumn(
        "label", F.concat(F.lit("row-"), F.col("id").cast("string"))
    )
    (
        df.write.format("pidctl-sql")
        .mode("append")
        .option("bootstrap", args.bootstrap)
        .option("url", args.url)
        .option("table", args.table)
        .option("partitions", str(df.rdd.getNumPartitions()))
        .save()
    )
    print(f"wrote {args.rows} rows in {args.partitions} partitions to {args.table}")
    spark.stop()


if __name__ == "__main__":
    main()
