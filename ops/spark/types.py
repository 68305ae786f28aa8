"""How the SQL sink stores each Spark SQL type, per database: the documented type map.

| Spark type | SQLite column (value stored) | PostgreSQL column |
|---|---|---|
| ByteType, ShortType | INTEGER | SMALLINT |
| IntegerType | INTEGER | INTEGER |
| LongType | BIGINT | BIGINT |
| FloatType | REAL | REAL |
| DoubleType | REAL | DOUBLE PRECISION |
| DecimalType(p, s) | TEXT (the exact decimal, e.g. ``'12.50'``) | NUMERIC(p, s) |
| StringType | TEXT | TEXT |
| BinaryType | BLOB | BYTEA |
| BooleanType | INTEGER (0 or 1) | BOOLEAN |
| DateType | TEXT (``'2024-02-29'``) | DATE |
| TimestampType | TEXT, UTC (``'2024-03-10 06:30:00.000000+00:00'``) | TIMESTAMPTZ |
| TimestampNTZType | TEXT (``'2024-03-10 01:30:00.000000'``) | TIMESTAMP |

Nulls are NULL in every column. SQLite keeps a decimal as text because its NUMERIC affinity
would turn ``12345678901234567890.123456789`` into a float; PostgreSQL keeps it exactly.
PySpark hands a TimestampType value to Python as a naive datetime in the Python worker's
local time; the sink turns it back into the instant (UTC) it stands for. Other types
(arrays, maps, structs, intervals, variant, void, and TIME, which Spark
4 leaves disabled by default) are refused with the column's name.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: A value's conversion before it is bound, or None to bind it as PySpark hands it over.
Converter = Callable[[Any], Any] | None


class UnsupportedColumn(ValueError):
    """A column whose Spark type the sink cannot store."""


def _utc(value: datetime.datetime) -> datetime.datetime:
    # Naive means the Python worker's local time (PySpark's conversion); fold is kept.
    return value.astimezone(datetime.UTC)


def _utc_text(value: datetime.datetime) -> str:
    return _utc(value).isoformat(sep=" ", timespec="microseconds")


def _iso_text(value: datetime.date) -> str:
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    return value.isoformat()


#: Spark's ``typeName()`` → (SQLite type, its converter, PostgreSQL type, its converter);
#: ``{p}`` and ``{s}`` stand for a decimal's precision and scale.
TYPE_MAP: dict[str, tuple[str, Converter, str, Converter]] = {
    "byte": ("INTEGER", None, "SMALLINT", None),
    "short": ("INTEGER", None, "SMALLINT", None),
    "integer": ("INTEGER", None, "INTEGER", None),
    "long": ("BIGINT", None, "BIGINT", None),
    "float": ("REAL", None, "REAL", None),
    "double": ("REAL", None, "DOUBLE PRECISION", None),
    "decimal": ("TEXT", str, "NUMERIC({p}, {s})", None),
    "string": ("TEXT", None, "TEXT", None),
    "binary": ("BLOB", bytes, "BYTEA", bytes),
    "boolean": ("INTEGER", None, "BOOLEAN", None),  # sqlite3 binds True as 1
    "date": ("TEXT", _iso_text, "DATE", None),
    "timestamp": ("TEXT", _utc_text, "TIMESTAMPTZ", _utc),
    "timestamp_ntz": ("TEXT", _iso_text, "TIMESTAMP", None),
}

DIALECTS = ("sqlite", "postgresql")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the user's table: its name, SQL type and how values are converted."""

    name: str
    sql_type: str
    convert: Converter


def plan_columns(fields: Sequence[Any], dialect: str) -> list[Column]:
    """The columns for a Spark schema's ``fields`` in ``dialect`` (``sqlite`` or
    ``postgresql``); raises :class:`UnsupportedColumn` naming the first column it cannot store."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    columns = []
    for field in fields:
        kind = field.dataType.typeName()
        if kind not in TYPE_MAP:
            supported = ", ".join(TYPE_MAP)
            raise UnsupportedColumn(
                f"column {field.name!r}: type {field.dataType.simpleString()} is not supported "
                f"by pidctl-sql (supported: {supported}; cast or serialise it first)"
            )
        sqlite_type, sqlite_convert, pg_type, pg_convert = TYPE_MAP[kind]
        sql_type, convert = (
            (sqlite_type, sqlite_convert) if dialect == "sqlite" else (pg_type, pg_convert)
        )
        if kind == "decimal":
            sql_type = sql_type.format(p=field.dataType.precision, s=field.dataType.scale)
        columns.append(Column(field.name, sql_type, convert))
    return columns


def row_converter(columns: Sequence[Column]) -> Callable[[Any], tuple[Any, ...]]:
    """A function from a Spark row to the tuple that is bound; ``tuple`` itself when no
    column needs converting (the common, fast case)."""
    converters = [(i, c.convert) for i, c in enumerate(columns) if c.convert is not None]
    if not converters:
        return tuple

    def convert(row: Any) -> tuple[Any, ...]:
        values = list(row)
        for index, function in converters:
            value = values[index]
            if value is not None:
                values[index] = function(value)
        return tuple(values)

    return convert
