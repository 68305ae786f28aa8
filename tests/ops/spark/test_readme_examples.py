"""The README's Spark examples run as written: each Python block of its Spark section, in the
session's SparkSession (``getOrCreate`` returns it), against the test's controller — the only
change is the controller's address, the data dir and the database file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ops.testing.serverproc import ServerProcess
from pidctl.spark.sqlstore import open_store

README = Path(__file__).resolve().parents[3] / "README.md"


def _spark_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Spark (`ops/spark/`)") : text.index("## The broker side")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_section_has_its_examples() -> None:
    assert len(_spark_blocks()) == 3


@pytest.mark.parametrize("index", range(3))
def test_each_example_runs(spark: Any, pidctl: ServerProcess, tmp_path: Path, index: int) -> None:
    block = _spark_blocks()[index]
    database = tmp_path / "orders.db"
    code = (
        block.replace("127.0.0.1:9093", pidctl.bootstrap)
        .replace("/tmp/orders.db", str(database))
        .replace("./pidctl-data", str(pidctl.data_dir))
    )
    exec(compile(code, f"README.md (Spark example {index + 1})", "exec"), {})
    if "pidctl-sql" in block:
        store = open_store(f"sqlite://{database}")
        try:
            assert store.execute("SELECT COUNT(*) FROM orders").fetchone() == (1000,)
        finally:
            store.close()
