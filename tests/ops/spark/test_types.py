"""Every Spark SQL atomic type, and nulls, round-trip through the sink into SQLite and
PostgreSQL by the documented type map; other types are refused by column name."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from typing import Any

import pytest

from ops.testing.serverproc import ServerProcess
from pidctl.spark import write_sql
from pidctl.spark.sink import PidctlSqlSink, SinkOptionError
from pidctl.spark.types import UnsupportedColumn, plan_columns
from tests.ops.spark.conftest import query

#: One row of every type; the session's time zone is not the workers' (UTC here), so a
#: TIMESTAMP literal is an instant in New York and must arrive as that instant.
SELECT = """
    SELECT CAST(-128 AS TINYINT) AS b, CAST(-32768 AS SMALLINT) AS s, 2147483647 AS i,
           9223372036854775807L AS l, CAST(1.5 AS FLOAT) AS f, 2.25D AS d,
           CAST('12345678901234567890.123456789' AS DECIMAL(38, 9)) AS dec,
           'zoë' AS str, X'00FF10' AS bin, true AS bo, DATE'2024-02-29' AS dt,
           TIMESTAMP'2024-03-10 01:30:00.123456' AS ts,
           TIMESTAMP_NTZ'2024-03-10 01:30:00.5' AS ntz,
           id / 100.0 AS ratio
    FROM range(1, 2)
"""
COLUMNS = "b, s, i, l, f, d, dec, str, bin, bo, dt, ts, ntz, ratio"
INSTANT = datetime.datetime(2024, 3, 10, 6, 30, 0, 123456, tzinfo=datetime.UTC)

SQLITE_ROW = (
    -128,
    -32768,
    2147483647,
    9223372036854775807,
    1.5,
    2.25,
    "12345678901234567890.123456789",
    "zoë",
    b"\x00\xff\x10",
    1,
    "2024-02-29",
    "2024-03-10 06:30:00.123456+00:00",
    "2024-03-10 01:30:00.500000",
    "0.010000",
)
POSTGRES_ROW = (
    -128,
    -32768,
    2147483647,
    9223372036854775807,
    1.5,
    2.25,
    Decimal("12345678901234567890.123456789"),
    "zoë",
    b"\x00\xff\x10",
    True,
    datetime.date(2024, 2, 29),
    INSTANT,
    datetime.datetime(2024, 3, 10, 1, 30, 0, 500000),
    Decimal("0.010000"),
)


def _write(df: Any, pidctl: ServerProcess, url: str, table: str, via: str) -> None:
    """Through the data source (``format``) or ``write_sql`` (Spark's JDBC writer for
    PostgreSQL)."""
    if via == "write_sql":
        write_sql(df, bootstrap=pidctl.bootstrap, url=url, table=table)
        return
    (
        df.write.format("pidctl-sql")
        .mode("append")
        .option("bootstrap", pidctl.bootstrap)
        .option("url", url)
        .option("table", table)
        .option("partitions", str(df.rdd.getNumPartitions()))
        .save()
    )


@pytest.fixture
def new_york(spark: Any) -> Any:
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    yield spark
    spark.conf.unset("spark.sql.session.timeZone")


@pytest.mark.parametrize("via", ["format", "write_sql"])
def test_every_atomic_type_round_trips(
    new_york: Any, pidctl: ServerProcess, url: str, via: str
) -> None:
    spark = new_york
    values = spark.sql(SELECT)
    nulls = spark.sql(SELECT).selectExpr(
        *[f"CAST(NULL AS {f.dataType.simpleString()}) AS {f.name}" for f in values.schema.fields]
    )
    _write(values.union(nulls).coalesce(1), pidctl, url, "every_type", via)
    rows = query(url, f"SELECT {COLUMNS} FROM every_type")
    expected = SQLITE_ROW if url.startswith("sqlite") else POSTGRES_ROW
    assert sorted(rows, key=lambda r: r[0] is None) == [expected, (None,) * len(expected)]
    if url.startswith("postgresql"):
        types = dict(
            query(
                url,
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'every_type'",
            )
        )
        assert types["dec"] == "numeric" and types["ts"] == "timestamp with time zone"
        assert types["ntz"] == "timestamp without time zone" and types["bin"] == "bytea"


#: Values at the edges: infinities, a decimal smaller than str() writes plainly, the first
#: instant of year 1 (in a session time zone west of UTC, where it is still year 0 locally).
EDGES = """
    SELECT CAST('Infinity' AS DOUBLE) AS d, CAST('-Infinity' AS FLOAT) AS f,
           CAST('-0.000000000000000001' AS DECIMAL(38, 18)) AS tiny,
           TIMESTAMP'0001-01-01 00:00:00Z' AS first_instant,
           TIMESTAMP_NTZ'2024-03-10 02:30:00' AS gap, DATE'0001-01-01' AS first_day
"""


@pytest.mark.parametrize("via", ["format", "write_sql"])
def test_edge_values_are_exact(new_york: Any, pidctl: ServerProcess, url: str, via: str) -> None:
    _write(new_york.sql(EDGES).coalesce(1), pidctl, url, "edges", via)
    (row,) = query(url, "SELECT d, f, tiny, first_instant, gap, first_day FROM edges")
    infinities = (float("inf"), float("-inf"))
    if url.startswith("sqlite"):
        first = "0001-01-01 00:00:00.000000+00:00"
        gap = "2024-03-10 02:30:00.000000"
        assert row == (*infinities, "-0.000000000000000001", first, gap, "0001-01-01")
    else:
        first_utc = datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)
        tiny = Decimal("-0.000000000000000001")
        gap_pg = datetime.datetime(2024, 3, 10, 2, 30)
        assert row == (*infinities, tiny, first_utc, gap_pg, datetime.date(1, 1, 1))


@pytest.mark.parametrize("via", ["format", "write_sql"])
def test_nan_round_trips_in_postgresql_and_is_refused_by_column_in_sqlite(
    spark: Any, pidctl: ServerProcess, url: str, via: str
) -> None:
    df = spark.sql("SELECT 1 AS id, CAST('NaN' AS DOUBLE) AS ratio").coalesce(1)
    if url.startswith("sqlite"):
        with pytest.raises(Exception, match="column 'ratio': NaN cannot be stored in SQLite"):
            _write(df, pidctl, url, "nans", via)
        assert query(url, "SELECT COUNT(*) FROM nans") == [(0,)]
    else:
        _write(df, pidctl, url, "nans", via)
        (row,) = query(url, "SELECT id, ratio FROM nans")
        assert row[0] == 1 and math.isnan(row[1])


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("array(1, 2)", "array<int>"),
        ("map('k', 1)", "map<string,int>"),
        ("named_struct('a', 1)", "struct<a:int>"),
        ("INTERVAL '1' DAY", "interval day"),
        ("NULL", "void"),
        ("parse_json('1')", "variant"),
    ],
)
def test_unsupported_types_are_refused_by_column(
    spark: Any, pidctl: ServerProcess, tmp_path: Any, expression: str, shown: str
) -> None:
    schema = spark.sql(f"SELECT 1 AS id, {expression} AS awkward").schema
    options = {"bootstrap": pidctl.bootstrap, "url": str(tmp_path / "x.db"), "table": "t"}
    message = rf"column 'awkward': type {shown} is not supported by pidctl-sql"
    with pytest.raises(SinkOptionError, match=message):
        PidctlSqlSink(options).writer(schema, False)
    with pytest.raises(UnsupportedColumn, match=message):
        plan_columns(schema.fields, "postgresql")
