"""Deploying the sink on a real Spark standalone cluster (docs/spark-deployment.md).

A master and a worker are started from pyspark's own SPARK_HOME (ops.testing.spark_cluster);
ops/spark/examples/cluster_write.py is submitted with ``bin/spark-submit --master spark://...``
against a real ``pidctl serve`` and writes into a SQLite file (once into a real PostgreSQL), the
way a user would run it.

The cluster's workers do not have pidctl: their ``python3`` (the first on the worker daemon's
PATH) is a bare virtual environment. The one thing not done as on a real cluster: the bare
and the wheel's environments see the test venv's third-party packages (pyspark, pyarrow, kio,
...) through a ``.pth`` file, instead of downloading them; pidctl itself comes only from the
wheel or the zip built here (``test_environments_have_pidctl_only_where_installed``).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.testing.postgres import PostgresProcess
from ops.testing.serverproc import ServerProcess, wait_until
from ops.testing.spark_cluster import SparkCluster, live_processes

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "ops" / "spark" / "examples" / "cluster_write.py"
ROWS = 3000
SUBMIT_TIMEOUT_S = 600

#: Kept small for the 2-core machine; the worker offers 1 core and 1g.
SUBMIT_OPTIONS = ("--conf", "spark.executor.memory=512m", "--conf", "spark.log.level=WARN")


@dataclass
class Packages:
    wheel: Path  # pip wheel --no-deps of the project
    zip: Path  # the wheel's pidctl/ tree, zipped for --py-files
    bare_python: Path  # a venv without pidctl: what the workers have
    wheel_python: Path  # a venv with the wheel installed


def _run(*command: str | Path, cwd: Path | None = None) -> None:
    subprocess.run([str(c) for c in command], check=True, capture_output=True, cwd=cwd, timeout=300)


def _venv(directory: Path) -> Path:
    """A venv of this interpreter that sees the test venv's third-party packages (not the
    editable pidctl: a .pth line adds a directory but runs no .pth file inside it)."""
    _run(sys.executable, "-m", "venv", "--without-pip", directory)
    python = directory / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "shared-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Packages:
    """The wheel, the zip and the two environments, built as docs/spark-deployment.md says."""
    base = tmp_path_factory.mktemp("packages")
    dist = base / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, ROOT)
    (wheel,) = dist.glob("pidctl-*.whl")
    tree = base / "tree"
    _run(sys.executable, "-m", "zipfile", "-e", wheel, tree)
    _run(sys.executable, "-m", "zipfile", "-c", base / "pidctl.zip", "pidctl", cwd=tree)
    bare = _venv(base / "bare")
    wheel_python = _venv(base / "wheel-venv")
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        wheel_python,
        "install",
        "--no-deps",
        "--no-index",
        wheel,
    )
    return Packages(wheel, base / "pidctl.zip", bare, wheel_python)


@pytest.fixture(scope="module")
def cluster(packages: Packages) -> Iterator[SparkCluster]:
    """A master and one worker whose executors run the bare venv's ``python3``."""
    path = f"{packages.bare_python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with SparkCluster(env={"PATH": path}) as running:
        groups = running.process_groups()
        yield running
    assert live_processes(groups) == []  # stop() left no master, worker or executor behind


def _submit(
    cluster: SparkCluster,
    pidctl: ServerProcess,
    url: Path | str,
    *options: str,
    env: dict[str, str],
    table: str = "events",
) -> subprocess.CompletedProcess[str]:
    command = [
        *cluster.submit_command(),
        *SUBMIT_OPTIONS,
        *options,
        str(EXAMPLE),
        "--bootstrap",
        pidctl.bootstrap,
        "--url",
        str(url),
        "--table",
        table,
        "--rows",
        str(ROWS),
    ]
    return subprocess.run(
        command,
        env=cluster.submit_env(**env),
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT_S,
    )


CHECK = (
    "SELECT COUNT(*), COUNT(DISTINCT id), MIN(id), MAX(id),"
    " SUM(CASE WHEN label = 'row-' || id THEN 0 ELSE 1 END) FROM {table}"
)


def _check_every_row_once(result: subprocess.CompletedProcess[str], found: tuple[int, ...]) -> None:
    """``found``: :data:`CHECK`'s answer (count, distinct ids, min, max, wrong labels)."""
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"wrote {ROWS} rows" in result.stdout
    assert tuple(found) == (ROWS, ROWS, 0, ROWS - 1, 0)


def _sqlite_check(db: Path) -> tuple[int, ...]:
    with sqlite3.connect(db) as connection:
        return tuple(connection.execute(CHECK.format(table="events")).fetchone())


def _jobs_done(cluster: SparkCluster) -> int:
    """Applications of the example the master lists as completed."""
    return sum(1 for app in cluster.applications() if app["name"] == "pidctl-cluster-write")


def _ran_on(cluster: SparkCluster, before: int) -> None:
    """The job registered with the standalone master (not a local[*] session)."""
    wait_until(lambda: _jobs_done(cluster) == before + 1, "the master lists the job as completed")


def test_environments_have_pidctl_only_where_installed(packages: Packages) -> None:
    """The premise of the cluster tests: the workers' Python lacks pidctl; the wheel's venv
    imports it from its own site-packages; the zip is importable from PYTHONPATH."""
    bare = subprocess.run(
        [packages.bare_python, "-c", "import pidctl.spark"], capture_output=True, text=True
    )
    assert "No module named 'pidctl'" in bare.stderr
    where = subprocess.run(
        [packages.wheel_python, "-c", "import pidctl.spark.sink as m; print(m.__file__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert str(packages.wheel_python.parents[1]) in where
    zipped = subprocess.run(
        [packages.bare_python, "-c", "import pidctl.spark.sink as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": str(packages.zip)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert zipped.startswith(str(packages.zip))


def test_wheel_renamed_to_zip_cannot_be_imported(packages: Packages, tmp_path: Path) -> None:
    """Why the docs re-zip the wheel's tree: pidctl is a namespace package (no
    pidctl/__init__.py), and zipimport finds one only through directory entries, which a
    wheel does not have. ``python -m zipfile -c`` writes them."""
    renamed = tmp_path / "pidctl.zip"
    renamed.write_bytes(packages.wheel.read_bytes())
    failed = subprocess.run(
        [packages.bare_python, "-c", "import pidctl.spark"],
        env={**os.environ, "PYTHONPATH": str(renamed)},
        capture_output=True,
        text=True,
    )
    assert "No module named 'pidctl'" in failed.stderr


@pytest.mark.slow
def test_cluster_start_names_a_taken_port() -> None:
    """The harness does not let Spark move to the next port (where nobody would look): a
    taken master port stops the start with the cause in one line, and the logs are kept."""
    cluster = SparkCluster()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", cluster.port))
        taken.listen()
        with pytest.raises(RuntimeError) as failed:
            cluster.start()
    message = str(failed.value)
    assert "\n" not in message
    assert "spark master exited" in message
    assert "Address already in use" in message
    assert cluster.log("master.log").exists()
    shutil.rmtree(cluster.directory)


@pytest.mark.slow
def test_executors_without_pidctl_fail_naming_it(
    cluster: SparkCluster, pidctl: ServerProcess, tmp_path: Path
) -> None:
    """The sharp edge: ``python3`` on the driver's machine has pidctl, on the workers it does
    not. The tasks fail on the executor with ModuleNotFoundError naming pidctl, and the
    aborted job leaves no rows."""
    db = tmp_path / "events.db"
    before = _jobs_done(cluster)
    driver_path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    result = _submit(
        cluster,
        pidctl,
        db,
        "--conf",
        "spark.task.maxFailures=1",  # fail at the first attempt (default 4)
        env={"PATH": driver_path},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "ModuleNotFoundError: No module named 'pidctl'" in output
    assert "PythonException" in output  # what the script's save() raised
    assert re.search(r"Lost task \S+ in stage \S+ \(TID \d+\) \(\S+ executor \d+\)", output)
    with sqlite3.connect(db) as connection:  # the driver created the table, then aborted
        assert connection.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
    _ran_on(cluster, before)


@pytest.mark.slow
def test_py_files_zip_writes_every_row_once(
    cluster: SparkCluster, packages: Packages, pidctl: ServerProcess, tmp_path: Path
) -> None:
    """(a) ``--py-files pidctl.zip``: driver and executors run the bare Python; pidctl comes
    only from the zip."""
    db = tmp_path / "events.db"
    before = _jobs_done(cluster)
    result = _submit(
        cluster,
        pidctl,
        db,
        "--py-files",
        str(packages.zip),
        env={"PYSPARK_PYTHON": str(packages.bare_python)},
    )
    _check_every_row_once(result, _sqlite_check(db))
    _ran_on(cluster, before)


@pytest.mark.slow
def test_installed_wheel_writes_every_row_once(
    cluster: SparkCluster, packages: Packages, pidctl: ServerProcess, tmp_path: Path
) -> None:
    """(b) ``spark.pyspark.python`` names a venv where the wheel is installed."""
    db = tmp_path / "events.db"
    before = _jobs_done(cluster)
    result = _submit(
        cluster,
        pidctl,
        db,
        "--conf",
        f"spark.pyspark.python={packages.wheel_python}",
        env={},
    )
    _check_every_row_once(result, _sqlite_check(db))
    _ran_on(cluster, before)


@pytest.mark.slow
def test_installed_wheel_writes_every_row_once_to_postgresql(
    cluster: SparkCluster, packages: Packages, pidctl: ServerProcess, postgres: PostgresProcess
) -> None:
    """The database the docs recommend on a real cluster: executors write to PostgreSQL
    (psycopg in the executors' Python)."""
    import psycopg

    before = _jobs_done(cluster)
    result = _submit(
        cluster,
        pidctl,
        postgres.url,
        "--conf",
        f"spark.pyspark.python={packages.wheel_python}",
        env={},
        table="cluster_events",
    )
    with psycopg.connect(postgres.url) as connection:
        row = connection.execute(CHECK.format(table="cluster_events")).fetchone()
    assert row is not None
    _check_every_row_once(result, tuple(int(value) for value in row))
    _ran_on(cluster, before)
