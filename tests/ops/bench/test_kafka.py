"""The rows against Apache Kafka produce real figures from a real Kafka and a real pidctl
(how good they are is for ops/bench, never for tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ops.bench import kafka, suite

THROUGHPUT_ROWS = [scenario.key for scenario in kafka.SCENARIOS]


@pytest.mark.slow
def test_every_kafka_row_runs_in_the_short_mode(tmp_path: Path) -> None:
    results = suite.main(["--short", "--only", ",".join(kafka.ROWS), "--out", str(tmp_path)])
    written = json.loads((tmp_path / "results.json").read_text())
    assert written == json.loads(json.dumps(results))
    rows = written["rows"]
    by_group = {row["group"]: row for row in rows}
    baselines = [row for row in rows if row["group"] == "kafka"]
    version = kafka.kafka_version()
    assert all(row["name"].startswith(f"Kafka {version}") for row in baselines)

    for key, baseline in zip(THROUGHPUT_ROWS, baselines, strict=False):
        row = by_group[key]
        assert version in row["baseline"]
        for side in (row, baseline):
            _assert_measured(side)
        # Kafka's CPU came from its own threads, named by the JVM.
        assert sum(row["kafka_threads_us_per_request"].values()) > 0, key
        assert row["rounds_counted"] in (0, 1)
        if row["rounds_counted"]:
            assert row["ratio"] == pytest.approx(row["per_second"] / baseline["per_second"])
        else:  # a busy machine's scheduler can pace the generator: said, not counted
            assert row["ratio"] is None and "client-bound" in row["why"]

    storm = by_group["kafka-storm"]
    assert storm["served"] == suite.SHORT["storm"] and storm["server_cpu_s"] > 0
    assert storm["ratio"] > 0 and storm["ratio_vs_shipped"] > 0
    kafka_storms = [row for row in baselines if "storm" in row["name"]]
    assert len(kafka_storms) == 2  # as shipped, and with pidctl's listen backlog
    for row in kafka_storms:
        assert row["served"] == suite.SHORT["storm"] and row["server_cpu_s"] > 0

    memory = by_group["kafka-memory-per-transactional-id"]
    kafka_memory = next(row for row in baselines if "live heap" in row["name"])
    assert memory["bytes_per_id"] > 0 and kafka_memory["bytes_per_id"] > 0
    assert memory["ratio"] == pytest.approx(kafka_memory["bytes_per_id"] / memory["bytes_per_id"])

    syncs = {
        row["name"].split(":")[0]: _syncs(row["syncs"])
        for row in rows
        if row["group"] == "kafka-syncs"
    }
    # pidctl syncs before it answers: at least one fdatasync per group of 16 requests (less
    # the group strace's attach can miss: what was synced before it, answered after).
    assert syncs["pidctl transactional"]["fdatasync"] >= 0.9 / 16
    assert syncs["pidctl allocate"]["fdatasync"] >= 0.9 / 16
    # flush.messages=1 took effect: every append of the transaction log is fsynced, as
    # shipped they are not.
    flushed = syncs["Kafka transactional, flush.messages=1"]["fsync"]
    assert flushed >= 1
    assert syncs["Kafka transactional, as shipped"].get("fsync", 0) < flushed
    # Kafka's controller fsyncs its Raft log's batches.
    assert syncs["Kafka controller allocate"]["fsync"] > 0


def _assert_measured(side: dict[str, Any]) -> None:
    assert side["per_second"] > 0 and side["requests"] > 0
    assert 0 < side["p50_ms"] <= side["p99_ms"]
    assert side["server_cores"] > 0 and side["server_cpu_us_per_request"] > 0
    assert side["loadgen_cores"] > 0 and side["loadgen_busy_share"] > 0
    assert side["machine_busy_cores"] > 0


def _syncs(text: str) -> dict[str, float]:
    words = text.split()
    return {call: float(n) for call, n in zip(words[::2], words[1::2], strict=True)}
