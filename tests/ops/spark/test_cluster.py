"""Deploying the sink on a real Spark standalone cluster (docs/spark-deployment.md).

A master and a worker are started from pyspark's own SPARK_HOME (ops.testing.spark_cluster);
ops/spark/examples/cluster_write.py is submitted with ``bin/spark-submit --master spark://...``
against a real ``pidctl serve`` and writes into a SQLite file (the wheel's run, into a real
PostgreSQL), the way a user would run it.

The cluster's workers do not have pidctl: their ``python3`` (the first on the worker daemon's
PATH) is a bare virtual environment. The one thing not done as on a real cluster: the bare
and the wheel's environments see the test venv's third-party packages (pyspark, pyarrow, kio,
...) through a ``.pth`` file, instead of downloading them; pidctl itself comes only from the
wheel or the zip built here (``test_environments_have_pidctl_only_where_installed``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
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
from tests import docs

ROOT = Path(__file__).resolve().parents[3]
DEPLOYMENT = "docs/spark-deployment.md"
WHEEL_SECTION = "(a) Recommended: install the wheel on every machine"
EXAMPLE = ROOT / "ops" / "spark" / "examples" / "cluster_write.py"
ROWS = 3000
SUBMIT_TIMEOUT_S = 600

#: Kept small for the 2-core machine; the worker offers 1 core and 1g.
SUBMIT_OPTIONS = ("--conf", "spark.executor.memory=512m", "--conf", "spark.log.level=WARN")


@dataclass
class Packages:
    checkout: Path  # a copy of the checkout: the page's commands run in its top folder
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


#: What a copy of the checkout leaves out: what .gitignore does (environments, caches,
#: build output, a data dir) and git's own files.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
    ".hypothesis", "build", "dist", "*.egg-info", "pidctl-data", "results", ".build",
)  # fmt: skip


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Packages:
    """The wheel, the zip and the two environments, built as docs/spark-deployment.md says:
    (b)'s commands as written, ``python`` the test venv's, in the top folder of a copy of the
    checkout (building a wheel writes build/ and pidctl.egg-info/ into the folder it builds:
    the test's copy, not the checkout)."""
    base = tmp_path_factory.mktemp("packages")
    checkout = base / "checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SOURCES)
    section = "(b) Ship pidctl with the job: `--py-files`"
    build = [c for c in docs.commands(docs.block(DEPLOYMENT, section)) if "spark-submit" not in c]
    # (a)'s wheel is (b)'s first command.
    assert docs.commands(docs.block(DEPLOYMENT, WHEEL_SECTION)) == build[:1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in build:
        subprocess.run(["bash", "-c", command], cwd=checkout, env=env, check=True, timeout=300)
    (wheel,) = (checkout / "dist").glob("pidctl-*.whl")
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
    return Packages(checkout, wheel, checkout / "pidctl.zip", bare, wheel_python)


@pytest.fixture(scope="module")
def cluster(packages: Packages) -> Iterator[SparkCluster]:
    """A master and one worker whose executors run the bare venv's ``python3``."""
    path = f"{packages.bare_python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with SparkCluster(env={"PATH": path}) as running:
        groups = running.process_groups()
        yield running
    assert live_processes(groups) == []  # stop() left no master, worker or executor behind


def _documented_submit(cluster: SparkCluster, section: str, moves: dict[str, str]) -> list[str]:
    """docs/spark-deployment.md's ``spark-submit`` line of ``section`` as written, with
    ``moves`` made (the test's addresses and files), against the test's cluster (its
    spark-submit and master, and the small machine's SUBMIT_OPTIONS); to be run in the top
    folder of the checkout's copy, as the page says."""
    in_section = [b.text for b in docs.blocks(DEPLOYMENT) if b.section == section]
    [line] = [c for text in in_section for c in docs.commands(text) if "spark-submit" in c]
    for written in moves:
        assert written in line, written
    line = docs.moved(line, moves)
    written_submit = ["spark-submit", "--master", "spark://HOST:7077"]
    argv = shlex.split(line)
    assert argv[:3] == written_submit, argv
    return [*cluster.submit_command(), *SUBMIT_OPTIONS, *argv[3:]]


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
    # Without the suite's PYTHONPATH, as the cluster's daemons run (it may hold the compiled
    # build: ops/compiled.py).
    unset = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    bare = subprocess.run(
        [packages.bare_python, "-c", "import pidctl.spark"],
        capture_output=True,
        text=True,
        env=unset,
    )
    assert "No module named 'pidctl'" in bare.stderr
    where = subprocess.run(
        [packages.wheel_python, "-c", "import pidctl.spark.sink as m; print(m.__file__)"],
        env=unset,
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
    """(b) ``--py-files pidctl.zip``, the page's command in the folder where its build
    commands left the zip: driver and executors run the bare Python; pidctl comes only from
    the zip."""
    db = tmp_path / "events.db"
    before = _jobs_done(cluster)
    moves = {
        "PIDCTL_HOST:9093": pidctl.bootstrap,
        "postgresql://user@db/app": str(db),
    }
    command = _documented_submit(cluster, "(b) Ship pidctl with the job: `--py-files`", moves)
    result = subprocess.run(
        command,
        cwd=packages.checkout,
        env=cluster.submit_env(PYSPARK_PYTHON=str(packages.bare_python)),
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT_S,
    )
    _check_every_row_once(result, _sqlite_check(db))
    _ran_on(cluster, before)


@pytest.mark.slow
def test_installed_wheel_writes_every_row_once_to_postgresql(
    cluster: SparkCluster, packages: Packages, pidctl: ServerProcess, postgres: PostgresProcess
) -> None:
    """(a)'s command as the page writes it (``spark.pyspark.python`` names a venv where the
    wheel is installed), into the database it recommends on a real cluster: executors write
    to PostgreSQL (psycopg in the executors' Python). (A run of the same command into SQLite
    was dropped to keep CI short: the zip's run writes SQLite on the same cluster.)"""
    import psycopg

    before = _jobs_done(cluster)
    url = postgres.new_database()
    moves = {
        "/opt/pidctl/bin/python": str(packages.wheel_python),
        "PIDCTL_HOST:9093": pidctl.bootstrap,
        "postgresql://user@db/app": url,
    }
    result = subprocess.run(
        _documented_submit(cluster, WHEEL_SECTION, moves),
        cwd=packages.checkout,
        env=cluster.submit_env(),
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT_S,
    )
    with psycopg.connect(url) as connection:
        row = connection.execute(CHECK.format(table="events")).fetchone()
    assert row is not None
    _check_every_row_once(result, tuple(int(value) for value in row))
    _ran_on(cluster, before)
