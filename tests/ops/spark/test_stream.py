"""``writeStream.format("pidctl-sql")``: every micro-batch exactly once, across a replay of a
batch the sink had committed and across a driver killed with SIGKILL mid-batch."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ops.testing.serverproc import ServerProcess, kill_group_when
from pidctl.spark.sqlstore import open_store, stage_table
from tests import docs

ROOT = Path(__file__).resolve().parents[3]
FILES, PER_FILE = 3, 1000
SCHEMA = "id LONG, name STRING"


def _source(folder: Path) -> Path:
    """FILES JSON files of PER_FILE rows: ids 0..FILES*PER_FILE-1, a second apart in
    modification time: Spark's file source takes new files oldest first, in any order when
    their times are equal (as files written in the same millisecond are), and the tests
    expect micro-batch N to be file N."""
    folder.mkdir()
    written = int(time.time()) - FILES
    for index in range(FILES):
        lines = (
            json.dumps({"id": i, "name": f"row-{i}"})
            for i in range(index * PER_FILE, (index + 1) * PER_FILE)
        )
        path = folder / f"part-{index}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (written + index, written + index))
    return folder


def _run(spark: Any, pidctl: ServerProcess, url: str, source: Path, checkpoint: Path) -> Any:
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("pidctl-sql")
        .option("checkpointLocation", str(checkpoint))
        .option("bootstrap", pidctl.bootstrap)
        .option("url", url)
        .option("table", "events")
        .option("partitions", "4")
        .option("batchSize", "100")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


def _select(url: str, sql: str) -> list[tuple[Any, ...]]:
    store = open_store(url)
    try:
        return sorted(tuple(r) for r in store.execute(sql).fetchall())
    finally:
        store.close()


EVERY_ROW = [(i, f"row-{i}") for i in range(FILES * PER_FILE)]


def test_each_micro_batch_lands_once_and_a_replayed_batch_writes_nothing(
    spark: Any, pidctl: ServerProcess, url: str, tmp_path: Path
) -> None:
    source, checkpoint = _source(tmp_path / "in"), tmp_path / "checkpoint"
    query = _run(spark, pidctl, url, source, checkpoint)
    assert _select(url, "SELECT id, name FROM events") == EVERY_ROW
    assert _select(url, "SELECT app_id, version FROM pidctl_sink_versions") == [
        (query.id, FILES - 1)
    ]
    # A driver that died after the sink published batch 2 but before Spark recorded it:
    # Spark replays batch 2 from its offsets; the sink knows it and writes nothing.
    for name in (str(FILES - 1), f".{FILES - 1}.crc"):  # the entry and Hadoop's checksum
        (checkpoint / "commits" / name).unlink()
    replay = _run(spark, pidctl, url, source, checkpoint)
    assert replay.id == query.id and replay.lastProgress["batchId"] == FILES - 1
    assert _select(url, "SELECT id, name FROM events") == EVERY_ROW
    skipped = _select(
        url, "SELECT app_version, reason FROM pidctl_sink_writes WHERE state = 'skipped'"
    )
    assert len(skipped) == 1 and skipped[0][0] == FILES - 1
    assert f"version {FILES - 1} of {query.id} was committed" in skipped[0][1]


@pytest.mark.slow
def test_a_streaming_driver_killed_mid_batch_resumes_exactly_once(
    spark: Any, pidctl: ServerProcess, url: str, tmp_path: Path
) -> None:
    source, checkpoint = _source(tmp_path / "in"), tmp_path / "checkpoint"
    command = [sys.executable, "-m", "tests.ops.spark.crash_driver", "--stream", str(source)]
    command += ["--checkpoint", str(checkpoint), "--bootstrap", pidctl.bootstrap, "--url", url]
    command += ["--table", "events", "--rows", "0", "--partitions", "4"]
    command += ["--hang-in-batch", "1", "--hang-after", "300"]
    driver = subprocess.Popen(
        command, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True
    )

    def staged_in_batch_1() -> int:
        sql = (
            f"SELECT COUNT(*) FROM {stage_table('events')} s JOIN pidctl_sink_writes w"
            " ON s.pidctl_write_id = w.write_id WHERE w.app_version = 1"
        )
        try:
            return int(_select(url, sql)[0][0])
        except Exception as e:
            if "pidctl_s" not in str(e):
                raise
            return 0

    kill_group_when(driver, lambda: staged_in_batch_1() >= 300, "batch 1 staged 300 rows", 240)
    # Batch 0 was published, batch 1 only staged: readers see batch 0 alone.
    assert _select(url, "SELECT id, name FROM events") == EVERY_ROW[:PER_FILE]

    _run(spark, pidctl, url, source, checkpoint)  # the query restarted from its checkpoint
    assert _select(url, "SELECT id, name FROM events") == EVERY_ROW
    assert _select(url, f"SELECT COUNT(*) FROM {stage_table('events')}") == [(0,)]
    superseded = _select(
        url, "SELECT app_version FROM pidctl_sink_writes WHERE reason LIKE 'superseded%'"
    )
    assert superseded == [(1,)]


def _documented_command() -> str:
    """docs/spark-sink.md's command that runs the streaming example."""
    [command] = docs.commands(docs.block("docs/spark-sink.md", "Structured Streaming", 0))
    return command


@pytest.mark.slow
def test_the_streaming_example_runs_as_written(pidctl: ServerProcess, tmp_path: Path) -> None:
    """docs/spark-sink.md's command, its addresses and folders moved into the test's (no
    PYSPARK_PYTHON: the example's local session runs its workers with this Python)."""
    source, url = _source(tmp_path / "in"), f"sqlite://{tmp_path / 'events.db'}"
    written = _documented_command()
    moves = {
        ".venv/bin/python": sys.executable,
        "127.0.0.1:9093": pidctl.bootstrap,
        "/tmp/incoming": str(source),
        "/tmp/checkpoints/events": str(tmp_path / "checkpoint"),
        "sqlite:///tmp/events.db": url,
    }
    command = shlex.split(docs.moved(written, moves))
    assert "/tmp/" not in " ".join(command[1:]).replace(str(tmp_path), "")
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYSPARK")}
    env["PYSPARK_SUBMIT_ARGS"] = "--conf spark.ui.enabled=false pyspark-shell"
    # A source folder not made yet: one line, before any Spark starts.
    missing = [part.replace(str(source), str(tmp_path / "none")) for part in command]
    refused = subprocess.run(missing, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 1
    assert (
        refused.stderr
        == f"--source {tmp_path / 'none'}: no such folder (make it, and put JSON files in it)\n"
    )
    said = []
    for _ in range(2):  # the second run finds everything done, and says so
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        said.append(done.stdout)
    assert f"wrote {FILES * PER_FILE} rows in {FILES} micro-batches to events" in said[0]
    assert "has seen every file there): nothing written" in said[1]
    assert _select(url, "SELECT id, name FROM events") == EVERY_ROW
