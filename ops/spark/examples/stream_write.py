"""Stream a folder of JSON files into a table, each micro-batch exactly once.

    python -m pidctl.spark.examples.stream_write --bootstrap 127.0.0.1:9093 \\
        --source /data/incoming --checkpoint /data/checkpoints/events \\
        --url sqlite:///data/events.db --table events

Reads every JSON file of ``--source`` (fields ``id`` and ``name``) that the checkpoint has
not seen, one file per micro-batch, then stops (``availableNow``) and says how many rows it
wrote; run it again later, or after a crash, with the same checkpoint: nothing is written
twice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pidctl.spark import register_data_sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="pidctl's HOST:PORT")
    parser.add_argument("--source", required=True, help="a folder of JSON files")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint folder")
    parser.add_argument("--url", required=True, help="sqlite:///PATH or postgresql://...")
    parser.add_argument("--table", required=True, help="the table the rows go to")
    args = parser.parse_args()
    if "://" not in args.source and not Path(args.source).is_dir():
        sys.exit(f"--source {args.source}: no such folder (make it, and put JSON files in it)")

    spark = SparkSession.builder.appName("pidctl-stream-write").getOrCreate()
    register_data_sources(spark)  # format("pidctl-sql")
    query = (
        spark.readStream.schema("id LONG, name STRING")
        .option("maxFilesPerTrigger", 1)
        .json(args.source)
        .writeStream.format("pidctl-sql")
        .option("checkpointLocation", args.checkpoint)
        .option("bootstrap", args.bootstrap)
        .option("url", args.url)
        .option("table", args.table)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    rows = sum(p.numInputRows for p in batches)
    if batches:
        print(
            f"query {query.id}: wrote {rows} rows in {len(batches)} micro-batches to {args.table}"
        )
    else:
        print(
            f"query {query.id}: no new JSON files in {args.source} (the checkpoint "
            f"{args.checkpoint} has seen every file there): nothing written"
        )
    spark.stop()


if __name__ == "__main__":
    main()
