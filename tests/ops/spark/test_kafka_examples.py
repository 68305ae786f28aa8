"""The pidctl-kafka examples of the README and docs/spark-kafka.md run as written, in the
session's SparkSession, against a real Kafka and pidctl — the only change is the addresses
and fresh topic and app names; the rows are then counted with a consumer."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import new_topic, read_values
from ops.testing.serverproc import ServerProcess
from tests import docs

ROOT = Path(__file__).resolve().parents[3]


def _blocks(path: Path, start: str | None = None, end: str | None = None) -> list[str]:
    text = path.read_text()
    if start is not None:
        text = text[text.index(start) :]
    if end is not None:
        text = text[: text.index(end)]
    return re.findall(r"```python\n(.*?)```", text, re.S)


EXAMPLES = [
    ("README", [docs.block("README.md", "Spark, exactly once", 1)], "orders", 1000),
    ("docs/spark-kafka.md", _blocks(ROOT / "docs" / "spark-kafka.md"), "events", 500),
]


def test_the_documents_have_their_examples() -> None:
    """The README's example, and docs/spark-kafka.md's two (the write, then write_kafka
    running the same version again), run one after the other."""
    assert [len(blocks) for _, blocks, _, _ in EXAMPLES] == [1, 2]


@pytest.mark.parametrize(
    ("where", "blocks", "topic", "rows"), EXAMPLES, ids=[e[0] for e in EXAMPLES]
)
def test_example_runs_and_writes_every_row_once(
    spark: Any,
    kafka: KafkaNode,
    job_pidctl: ServerProcess,
    where: str,
    blocks: list[str],
    topic: str,
    rows: int,
) -> None:
    fresh = new_topic(kafka.bootstrap, 2, prefix=topic)
    addresses = {"127.0.0.1:9092": kafka.bootstrap, "127.0.0.1:9093": job_pidctl.bootstrap}
    code = (
        docs.moved("\n".join(blocks), addresses)
        .replace(f'"{topic}"', f'"{fresh}"')
        .replace('"nightly-orders"', f'"nightly-{uuid.uuid4().hex[:8]}"')
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"{where} (pidctl-kafka example)", "exec"), {})
    values = read_values(kafka.bootstrap, fresh)
    assert len(values) == len(set(values)) == rows
    if len(blocks) > 1:
        assert printed.getvalue().split() == ["skipped", "0"]
