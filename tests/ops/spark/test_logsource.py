"""The metadata log as a DataFrame, against `pidctl log dump --json` on a real data dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.protocol import requests


def _dump(data_dir: Path) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "log",
            "dump",
            "--data-dir",
            str(data_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if line.startswith("{")]


def _read(spark: Any, data_dir: Path) -> list[Any]:
    rows: list[Any] = (
        spark.read.format("pidctl-log").load(str(data_dir)).orderBy("offset").collect()
    )
    return rows


def _traffic(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap, client_id="report-test") as client:
        epoch = client.request(requests.registration(7, server.cluster_id())).broker_epoch
        client.pipeline([requests.allocate(7, int(epoch))] * 200)
        client.pipeline([requests.allocate(-1, -1)] * 20)
        for i in range(30):
            client.request(requests.init_producer_id(f"txn-{i}"))


def test_the_reader_returns_what_log_dump_prints(spark: Any, pidctl: ServerProcess) -> None:
    _traffic(pidctl)
    rows = _read(spark, pidctl.data_dir)
    dumped = _dump(pidctl.data_dir)
    assert [row.record for row in rows] == dumped
    assert len(list(pidctl.data_dir.glob("*.log"))) > 1  # one partition per segment
    types = {row.type for row in rows}
    assert {
        "ClusterCreated",
        "BrokerRegistered",
        "ProducerIdsGranted",
        "TransactionalIdUpdated",
    } <= types
    grant = next(r for r in rows if r.type == "ProducerIdsGranted" and r.holder == "broker")
    assert (grant.broker_id, grant.next_producer_id - grant.first_producer_id) == (7, 1000)
    assert json.loads(grant.record)["first_producer_id"] == grant.first_producer_id
    per_holder = (
        spark.read.format("pidctl-log")
        .load(str(pidctl.data_dir))
        .where("type = 'ProducerIdsGranted' AND client_id = 'report-test'")
        .groupBy("holder")
        .count()
        .collect()
    )
    assert {r.holder: r["count"] for r in per_holder} == {"broker": 200, "job": 20}


def test_a_torn_tail_ends_the_last_partition_cleanly(
    spark: Any, pidctl: ServerProcess, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(pidctl.data_dir, copy, ignore=shutil.ignore_patterns("*.lock"))
    last = sorted(copy.glob("*.log"))[-1]
    with last.open("ab") as f:
        f.write(b"\x00\x00\x01\x00partial")  # what a crash mid-write leaves
    rows = _read(spark, copy)
    assert [row.record for row in rows] == _dump(copy) == _dump(pidctl.data_dir)[: len(rows)]


def test_the_example_report_runs(pidctl: ServerProcess) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pidctl.spark.examples.pid_report", str(pidctl.data_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "# PIDs granted per holder per hour" in out.stdout
    assert "report-test" in out.stdout
    assert "years_left" in out.stdout
