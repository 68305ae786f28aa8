"""The log as an operator meets it, each case produced for real: `pidctl log dump` and `verify`
on a data dir a loaded server is rolling and snapshotting; the audit trail kept by default
after snapshots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.testing.grants import Acknowledged, GrantLoad
from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.controller.log.metalog import SNAPSHOT_SUFFIX
from pidctl.protocol import requests

pytestmark = pytest.mark.slow


def _pidctl(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pidctl.controller.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


#: Rolls and snapshots all the time, and nothing kept below a snapshot: what makes a live
#: read race with the server.
CHURN = ("--snapshot-interval-records", "20", "--segment-max-bytes", "3000")
DELETE_COVERED = ("--log-retention-bytes", "0")


def test_dump_and_verify_are_safe_while_the_server_rolls_and_snapshots(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d", *CHURN, *DELETE_COVERED)
    with server:
        acked = Acknowledged()
        load = GrantLoad(server.bootstrap, server.cluster_id(), acked).start()
        try:
            results = []
            for _ in range(25):
                results.append(
                    ("verify", _pidctl("log", "verify", "--data-dir", str(server.data_dir)))
                )
                results.append(("dump", _pidctl("log", "dump", "--data-dir", str(server.data_dir))))
            snapshots = sum(e.get("event") == "snapshot written" for e in server.events)
        finally:
            load.stop()
    assert snapshots > 10, "the server should have snapshotted (and deleted) all along"
    for command, result in results:
        said = result.stdout + result.stderr
        assert "Traceback" not in said and "CORRUPT" not in said, (command, said[-2000:])
        # A write caught half done at the very end is the only thing a live read may see.
        assert result.returncode == 0 or "DAMAGED TAIL" in result.stdout, (command, said)
    assert sum(result.returncode == 0 for _, result in results) > len(results) // 2


def _snapshotted(server: ServerProcess) -> bool:
    return any(e.get("event") == "snapshot written" for e in server.events)


def _grants_until_a_snapshot(server: ServerProcess, grants: int = 60) -> None:
    with SyncClient(server.bootstrap) as client:
        for _ in range(grants):
            assert client.request(requests.allocate(-1, -1)).error_code == 0
    wait_until(lambda: _snapshotted(server), "a snapshot")


def test_the_audit_trail_is_kept_after_snapshots_by_default(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "d", *CHURN) as server:
        _grants_until_a_snapshot(server)
    assert any(p.suffix == SNAPSHOT_SUFFIX for p in server.data_dir.iterdir())
    dump = _pidctl("log", "dump", "--data-dir", str(server.data_dir), "--json")
    records = [json.loads(line) for line in dump.stdout.splitlines()]
    assert dump.returncode == 0 and records[0]["offset"] == 0  # the whole history
    assert "removed" not in dump.stderr
    # With retention off (size or time), the dump and verify say what is gone.
    for setting in (("--log-retention-bytes", "0"), ("--log-retention-ms", "0")):
        data_dir = tmp_path / setting[0].strip("-")
        with ServerProcess(data_dir, *CHURN, *setting) as server:
            _grants_until_a_snapshot(server)
        text = _pidctl("log", "dump", "--data-dir", str(data_dir))
        notes = [line for line in text.stdout.splitlines() if line.startswith("# records")]
        assert len(notes) == 1 and "were removed" in notes[0], text.stdout[:500]
        as_json = _pidctl("log", "dump", "--data-dir", str(data_dir), "--json")
        assert "were removed" in as_json.stderr  # stdout stays JSON lines
        assert all(line.startswith("{") for line in as_json.stdout.splitlines())
        verify = _pidctl("log", "verify", "--data-dir", str(data_dir))
        assert verify.returncode == 0 and "were removed" in verify.stdout
