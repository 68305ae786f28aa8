"""``spark.read.format("pidctl-log").load(DATA_DIR)``: pidctl's metadata log as a DataFrame.

One partition per segment file; each is read with the log's own parser, stopping cleanly at a
torn tail of the last segment (as recovery would truncate it) and failing on corruption
anywhere else. Columns: ``offset``, ``timestamp`` (UTC), ``type`` (the record type's name),
the fields the record types share (``broker_id``, ``broker_epoch``, ``first_producer_id``,
``next_producer_id``, ``holder``, ``principal``, ``client_id``, ``transactional_id``,
``producer_id``, ``producer_epoch``), and ``record``: the whole record as the JSON line
``pidctl log dump --json`` prints. Records already covered by a snapshot are only there while
``log_retention_bytes`` and ``log_retention_ms`` keep their segments (100 MiB and 7 days by
default).

The data dir must be readable where the tasks run (a shared volume on a cluster).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pidctl.controller.core.logformat import (
    SEGMENT_SUFFIX,
    LogCorruption,
    entry_to_dict,
    offset_of,
    scan_segment,
)

SCHEMA = (
    "offset BIGINT, timestamp TIMESTAMP, type STRING, broker_id INT, broker_epoch BIGINT, "
    "first_producer_id BIGINT, next_producer_id BIGINT, holder STRING, principal STRING, "
    "client_id STRING, transactional_id STRING, producer_id BIGINT, producer_epoch INT, "
    "record STRING"
)
_FIELDS = (
    "broker_id",
    "broker_epoch",
    "first_producer_id",
    "next_producer_id",
    "holder",
    "principal",
    "client_id",
    "transactional_id",
    "producer_id",
    "producer_epoch",
)


class SegmentPartition(InputPartition):
    """One segment file; only the last may end in a torn record."""

    def __init__(self, path: str, base_offset: int, last: bool) -> None:
        super().__init__(path)
        self.path = path
        self.base_offset = base_offset
        self.last = last


def segment_partitions(data_dir: Path) -> list[SegmentPartition]:
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: no such data dir")
    paths = sorted(data_dir.glob("*" + SEGMENT_SUFFIX), key=offset_of)
    return [
        SegmentPartition(str(p), offset_of(p), i == len(paths) - 1) for i, p in enumerate(paths)
    ]


def read_segment(partition: SegmentPartition) -> Iterator[tuple[Any, ...]]:
    """The rows of one segment."""
    scan = scan_segment(Path(partition.path).read_bytes(), partition.base_offset)
    if scan.problem is not None and not (partition.last and scan.torn):
        raise LogCorruption(f"{partition.path}: corrupt record {scan.problem}")
    for entry in scan.entries:
        item = entry_to_dict(entry)
        moment = datetime.datetime.fromtimestamp(entry.timestamp_ms / 1000, datetime.UTC)
        yield (
            entry.offset,
            moment,
            item["type"],
            *(item.get(name) for name in _FIELDS),
            json.dumps(item, separators=(",", ":")),
        )


class PidctlLogSource(DataSource):
    """The data source; see the module documentation."""

    @classmethod
    def name(cls) -> str:
        return "pidctl-log"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> PidctlLogReader:
        path = self.options.get("path")
        if not path:
            raise ValueError(
                'pidctl-log needs a data dir: spark.read.format("pidctl-log").load(DIR)'
            )
        return PidctlLogReader(Path(path))


class PidctlLogReader(DataSourceReader):
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def partitions(self) -> list[InputPartition]:
        return list(segment_partitions(self.data_dir))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SegmentPartition)
        return read_segment(partition)
