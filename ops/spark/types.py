"""How the SQL sink stores each Spark SQL type, per database: the documented type map.

| Spark type | SQLite column (value stored) | PostgreSQL column |
|---|---|---|
| ByteType, ShortType | INTEGER | SMALLINT |
| IntegerType | INTEGER | INTEGER |
| LongType | BIGINT | BIGINT |
| FloatType | REAL (NaN refused) | REAL |
| DoubleType | REAL (NaN refused) | DOUBLE PRECISION |
| DecimalType(p, s) | TEXT (the exact decimal, plain: ``'12.50'``, ``'0.000001'``) | NUMERIC(p, s) |
| StringType | TEXT | TEXT |
| BinaryType | BLOB | BYTEA |
| BooleanType | INTEGER (0 or 1) | BOOLEAN |
| DateType | TEXT (``'2024-02-29'``) | DATE |
| TimestampType | TEXT, UTC (``'2024-03-10 06:30:00.000000+00:00'``) | TIMESTAMPTZ |
| TimestampNTZType | TEXT (``'2024-03-10 01:30:00.000000'``) | TIMESTAMP |

Nulls are NULL in every column. SQLite keeps a decimal as text because its NUMERIC affinity
would turn ``12345678901234567890.123456789`` into a float; PostgreSQL keeps it exactly.
SQLite has no NaN (it stores NULL instead), so a NaN in a SQLite column is refused naming the
column; infinities round-trip. The Python writers read Spark's Arrow batches: a TimestampType
value is the instant itself (UTC), never a local time of the worker, so every year from 1 to
9999 round-trips whatever the workers' time zone. Other types
(arrays, maps, structs, intervals, variant, void, and TIME, which Spark
4 leaves disabled by default) are refused with the column's name.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: A value's conversion before it is bound, or None to bind it as PySpark hands it over.
Converter = Callable[[Any], Any] | None


class UnsupportedColumn(ValueError):
    """A column whose Spark type the sink cannot store."""


def _utc(value: datetime.datetime) -> datetime.datetime:
    # Aware (UTC, from Arrow) stays itself; naive means the Python worker's local time.
    return value.astimezone(datetime.UTC)


def _utc_text(value: datetime.datetime) -> str:
    return _utc(value).isoformat(sep=" ", timespec="microseconds")


def _iso_text(value: datetime.date) -> str:
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    return value.isoformat()


def _plain_decimal(value: decimal.Decimal) -> str:
    # str() would write 1E-18 for a small value; the documented form is plain digits.
    return format(value, "f")


#: Spark's ``typeName()`` → (SQLite type, its converter, PostgreSQL type, its converter);
#: ``{p}`` and ``{s}`` stand for a decimal's precision and scale.
TYPE_MAP: dict[str, tuple[str, Converter, str, Converter]] = {
    "byte": ("INTEGER", None, "SMALLINT", None),
    "short": ("INTEGER", None, "SMALLINT", None),
    "integer": ("INTEGER", None, "INTEGER", None),
    "long": ("BIGINT", None, "BIGINT", None),
    "float": ("REAL", None, "REAL", None),
    "double": ("REAL", None, "DOUBLE PRECISION", None),
    "decimal": ("TEXT", _plain_decimal, "NUMERIC({p}, {s})", None),
    "string": ("TEXT", None, "TEXT", None),
    "binary": ("BLOB", None, "BYTEA", None),
    "boolean": ("INTEGER", None, "BOOLEAN", None),  # sqlite3 binds True as 1
    "date": ("TEXT", _iso_text, "DATE", None),
    "timestamp": ("TEXT", _utc_text, "TIMESTAMPTZ", None),  # aware, in UTC
    "timestamp_ntz": ("TEXT", _iso_text, "TIMESTAMP", None),
}

DIALECTS = ("sqlite", "postgresql")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the user's table: its name, SQL type and how values are converted."""

    name: str
    sql_type: str
    convert: Converter
    #: Spark's ``typeName()`` of the column.
    kind: str = ""
    #: The dialect it is stored in.
    dialect: str = ""


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
        columns.append(Column(field.name, sql_type, convert, kind, dialect))
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


def arrow_rows(batch: Any, columns: Sequence[Column]) -> list[tuple[Any, ...]]:
    """The rows of one of Spark's Arrow record batches, as the tuples that are bound: values
    converted by the type map. Raises ValueError naming the column of a value the database
    cannot hold (a NaN in SQLite) or that cannot be converted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = []
    for index, column in enumerate(columns):
        array = batch.column(index)
        try:
            if column.kind == "timestamp":
                # The instant in UTC, whatever zone Spark labelled it with: no local time.
                array = array.cast(pa.timestamp("us", tz="UTC"))
            if (
                column.dialect == "sqlite"
                and column.kind in ("float", "double")
                and pc.any(pc.is_nan(array)).as_py()
            ):
                raise ValueError("NaN cannot be stored in SQLite (it would become NULL)")
            items = array.to_pylist()
            if column.convert is not None:
                function = column.convert
                items = [None if item is None else function(item) for item in items]
        except (ValueError, TypeError, OverflowError, pa.ArrowException) as e:
            raise ValueError(f"column {column.name!r}: {e}") from None
        values.append(items)
    return list(zip(*values, strict=True)) if values else [()] * batch.num_rows


#: Dates and instants staged as numbers by write_sql (days, microseconds since 1970), turned
#: back into values by the publish in PostgreSQL with integer arithmetic only (a whole day, a
#: part of one: each factor exact in a double): no time zone of a worker's JVM, and no
#: calendar of java.sql.Timestamp, ever sees them. (Spark's JDBC writer binds a timestamp
#: through the executor's default time zone, where New York's local mean time before 1883,
#: -4:56:02, cost 3 min 58 s in year 1.)
_DAY_US = 86_400_000_000
_FROM_MICROS = (
    f"(TIMESTAMP '1970-01-01' + ({{c}} / {_DAY_US}) * INTERVAL '1 day'"
    f" + ({{c}} % {_DAY_US}) * INTERVAL '1 microsecond')"
)
#: Spark's ``typeName()`` → (the stage's column type, the Spark SQL expression that stages a
#: value of column ``{c}``, the PostgreSQL expression that publishes staged column ``{c}``).
JDBC_STAGED_AS: dict[str, tuple[str, str, str]] = {
    "timestamp": ("BIGINT", "unix_micros({c})", f"({_FROM_MICROS} AT TIME ZONE 'UTC')"),
    # As text (Spark writes a TIMESTAMP_NTZ without any zone): Spark's timestampdiff and
    # casts to TIMESTAMP go through the session's zone, where 2024-03-10 02:30 in New York
    # does not exist (it became 03:30).
    "timestamp_ntz": ("TEXT", "CAST({c} AS STRING)", "CAST({c} AS TIMESTAMP)"),
    "date": ("INTEGER", "unix_date({c})", "(DATE '1970-01-01' + {c})"),
}
