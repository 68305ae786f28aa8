"""The Spark examples of the README and docs/spark-sink.md run as written: each saved as a
file and run by the venv's Python, as the page says (``.venv/bin/python example.py``), in
a fresh process without ``PYSPARK_PYTHON`` in its environment, against the test's controller.
The three run one after another in one process (each as ``__main__``, as a notebook runs
cells: ``getOrCreate()`` returns the first one's session), which spares two JVM start-ups.
The only changes: the controller's address, the database file, and no Spark web UI (it
would bind port 4040 or the next free one; the tests open no fixed port)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from ops.testing.serverproc import ServerProcess
from tests import docs

SPARK_SPEC = docs.ROOT / "docs" / "spark-sink.md"
#: A job's producer ids; the SQL sink; the metadata log as a DataFrame.
EXAMPLES = (
    ("docs/spark-sink.md", "Producer ids for a whole job, fetched once by the driver", 0),
    ("README.md", "Spark, exactly once", 0),
    ("docs/spark-sink.md", "The metadata log as a DataFrame", 0),
)
#: Runs each file given as ``__main__``, one after another, marking where each begins.
RUNNER = """\
import runpy, sys
for path in sys.argv[1:]:
    print(f"=== {path}", flush=True)
    runpy.run_path(path, run_name="__main__")
"""


def _spark_blocks() -> list[str]:
    return [docs.block(*place) for place in EXAMPLES]


def test_the_examples_run_as_written(pidctl: ServerProcess, tmp_path: Path) -> None:
    database = tmp_path / "orders.db"
    names = []
    for index, block in enumerate(_spark_blocks()):
        moves = {"127.0.0.1:9093": pidctl.bootstrap, "/tmp/orders.db": str(database)}
        (tmp_path / f"example{index + 1}.py").write_text(docs.moved(block, moves))
        names.append(f"example{index + 1}.py")
    (tmp_path / "run.py").write_text(RUNNER)
    # `./pidctl-data` is where `ops/dev.sh serve` keeps its log: here, the test server's.
    (tmp_path / "pidctl-data").symlink_to(pidctl.data_dir)
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYSPARK")}
    env["PYSPARK_SUBMIT_ARGS"] = "--conf spark.ui.enabled=false pyspark-shell"
    done = subprocess.run(
        [sys.executable, "run.py", *names],  # the venv's Python: .venv/bin/python
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "ModuleNotFoundError" not in done.stderr
    said = dict(re.findall(r"^=== (example\d\.py)\n(.*?)(?=^=== |\Z)", done.stdout, re.S | re.M))
    assert sorted(said) == names
    # 1: a job's producer ids, and the columns derived from them in the tasks.
    producer_id, epoch = re.findall(r"^\((\d+), (\d+)\)$", said["example1.py"], re.M)[0]
    assert epoch == "0"
    assert re.search(rf"\|\s*\d+\|\s*{producer_id}\|\s*0\|\s*\d+\|", said["example1.py"])
    # 2: the sink's rows, and docs/spark-sink.md's query of the versions, as written there.
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT COUNT(*) FROM orders").fetchone() == (1000,)
        [query] = re.findall(r"```sql\n(.*?)```", SPARK_SPEC.read_text(), re.S)
        assert db.execute(query).fetchall() == [("nightly-orders", 1)]
    # 3: the metadata log as a DataFrame.
    assert re.search(r"\|\s*ClusterCreated\|\s*1\|", said["example3.py"]), said["example3.py"]
