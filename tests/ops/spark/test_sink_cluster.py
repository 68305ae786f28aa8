"""Issue 33 on a real standalone cluster: a master and two workers (their time zone
America/New_York, west of UTC), a real pidctl and PostgreSQL. tests/ops/spark/cluster_sink_job.py
is submitted with ``spark-submit`` and PostgreSQL's JDBC driver (``--jars``), as a user would;
it reports what it saw per case, judged here. The benchmark's job against ``df.write.jdbc``
runs once too, small (its figures are the README's, not asserted)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ops.bench.spark import jdbc_job_options, jdbc_rounds
from ops.testing.postgres import PostgresProcess
from ops.testing.serverproc import ServerProcess
from ops.testing.spark_cluster import SparkCluster, live_processes

ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "tests" / "ops" / "spark" / "cluster_sink_job.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    with SparkCluster(workers=2, env={"TZ": "America/New_York"}) as running:
        groups = running.process_groups()
        yield running
    assert live_processes(groups) == []


@pytest.fixture(scope="module")
def cases(
    cluster: SparkCluster,
    pidctl: ServerProcess,
    postgres: PostgresProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("cluster-cases")
    command = [
        *cluster.submit_command(),
        *jdbc_job_options(),
        str(JOB),
        "--bootstrap",
        pidctl.bootstrap,
        "--url",
        postgres.new_database(),
        "--sqlite",
        str(tmp / "cases.db"),
        "--gate",
        str(tmp / "gate"),
    ]
    done = subprocess.run(
        command,
        env=cluster.submit_env(PYSPARK_PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {report.pop("case"): report for report in reports}


def test_a_rerun_of_a_committed_version_is_decided_on_the_driver(
    cases: dict[str, dict[str, Any]],
) -> None:
    rerun = cases["rerun"]
    assert rerun["first"] == ["committed", 20_000]
    assert rerun["table"] == [20_000, 20_000]
    assert rerun["jobs"] == 0  # no Spark job: no task read a row
    assert rerun["again"][0] == "skipped"
    assert rerun["again"][1].startswith("version 3 of nightly was committed by write ")
    assert rerun["skipped_rows"] == 1


def test_a_lower_version_losing_a_race_fails_naming_the_winner(
    cases: dict[str, dict[str, Any]],
) -> None:
    race = cases["race"]
    assert race["error"].startswith("ConcurrentWriteError: write ")
    assert (
        f"(version 1 of app) lost a race: write {race['winner']} committed version 2 of app to"
        " raced while it ran; nothing of this write is published"
    ) in race["error"]
    assert race["table"] == 10


def test_table_identity_is_the_databases_and_reserved_words_are_names(
    cases: dict[str, dict[str, Any]],
) -> None:
    assert cases["names"] == {"orders_cf": [20_000, 20_000], "order": [10, "u"]}


def test_schema_problems_are_named_before_any_task(cases: dict[str, dict[str, Any]]) -> None:
    schema = cases["schema"]
    assert schema["jobs"] == 0
    assert schema["mismatch"] == (
        "SchemaMismatch: table narrow: columns differ: the DataFrame's 'name' not in the table;"
        " the table's 'amount' not in the DataFrame (select the table's columns, or ALTER TABLE"
        " first)"
    )
    assert schema["too_few"].startswith(
        "SinkOptionError: option partitions is 4, but the DataFrame has 8 partitions"
    )


def test_edge_values_are_exact_in_workers_west_of_utc(cases: dict[str, dict[str, Any]]) -> None:
    edges = cases["edges"]
    assert edges["worker_time_zone"] in (["EST"], ["EDT"])
    first = datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)
    infinity = float("inf")  # JSON's Infinity
    gap, first_day = "2024-03-10 02:30:00", "0001-01-01"
    tiny = str(Decimal("-0.000001000"))
    assert edges["postgresql"] == [[str(first), infinity, tiny, gap, first_day]]
    assert edges["sqlite"] == [
        ["0001-01-01 00:00:00.000000+00:00", infinity, tiny, f"{gap}.000000", first_day]
    ]
    assert (
        "column 'ratio': NaN cannot be stored in SQLite (it would become NULL)"
        in (edges["nan_refused"])
    )


def test_the_benchmark_against_spark_jdbc_runs(
    cluster: SparkCluster, pidctl: ServerProcess, postgres: PostgresProcess
) -> None:
    """The README's row, small: both sinks write every row (the job checks the counts), and
    each round has its ratio; no figure is asserted."""
    out = jdbc_rounds(cluster, postgres, pidctl.bootstrap, 4_000, 4, 1)
    (round_,) = out["rounds"]
    assert round_["ratio"] > 0 and round_["jdbc_s"] > 0
    assert round_["ratio_to_rewrite"] > 0 and round_["jdbc_rewrite_s"] > 0
    assert set(round_["cpu_s"]) == {"jdbc", "jdbc_rewrite", "pidctl_sql"}
    assert set(round_["cpu_s"]["pidctl_sql"]) == {"executors", "postgres", "driver"}
