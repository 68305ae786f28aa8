"""``pidctl sink recover`` and ``pidctl sink versions``: what operators run against the sink's
database."""

from __future__ import annotations

import subprocess
import sys

from pidctl.spark.sqlstore import ProducerReport, Write, open_store, stage_table

CLI = [sys.executable, "-m", "pidctl.controller.cli", "sink"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def _staged(url: str) -> int:
    store = open_store(url)
    try:
        return int(store.execute(f"SELECT COUNT(*) FROM {stage_table('events')}").fetchone()[0])
    finally:
        store.close()


def test_recover_and_versions(url: str) -> None:
    store = open_store(url)
    store.create_tables("events", [("id", "BIGINT")])
    store.begin_write(Write("done", "events", "job", "nightly", 3))
    store.apply_batch("done", "events", ["id"], 1, 0, 0, [(1,)])
    store.publish("done", "events", ["id"], [ProducerReport("done", 0, 1, 0, 0, 1, 0)])
    store.begin_write(Write("crashed", "events", "job"))  # its driver was killed mid-write
    store.apply_batch("crashed", "events", ["id"], 2, 0, 0, [(2,), (3,)])
    store.close()

    kept = _run("recover", url, "events")  # it might still be running: within the hour
    assert kept.returncode == 0 and kept.stdout.endswith("0 abandoned write(s) to events\n")
    assert _staged(url) == 2
    done = _run("recover", url, "events", "--older-than", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "aborted the abandoned write crashed; its staged rows are removed",
        "1 abandoned write(s) to events",
    ]
    assert _staged(url) == 0
    versions = _run("versions", url, "events")
    assert (versions.returncode, versions.stdout) == (0, "nightly\t3\n")


def test_bad_input_gets_one_line(url: str) -> None:
    bad_table = _run("recover", url, "events; DROP TABLE x")
    assert bad_table.returncode == 2
    assert bad_table.stderr.splitlines() == [
        "pidctl: 'events; DROP TABLE x' is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)"
    ]
    missing = _run("versions", url, "events")  # no sink tables in this database yet
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1
    negative = _run("recover", url, "events", "--older-than", "-1")
    assert negative.returncode == 2 and "must not be negative" in negative.stderr
