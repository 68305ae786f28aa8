"""The Spark benchmark's measurements run (small), in the session's SparkSession, and report
every ratio against their baselines; no timing is asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ops.bench.spark import PlainAppend, sink_throughput, stream_source, stream_throughput
from ops.testing.serverproc import ServerProcess


def test_sink_and_stream_rows_have_their_ratios(
    spark: Any, pidctl: ServerProcess, url: str, tmp_path: Path
) -> None:
    spark.dataSource.register(PlainAppend)
    batch = sink_throughput(spark, pidctl.bootstrap, url, 4000, 2)
    assert batch["exactly_once_vs_plain"] > 0 and batch["plain_rows_per_s"] > 0
    source = stream_source(tmp_path / "in", 4000, 2)
    stream = stream_throughput(spark, pidctl.bootstrap, url, source, 4000, tmp_path)
    assert stream["exactly_once_vs_foreach_batch"] > 0
