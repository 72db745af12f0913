"""Exact through type changes and temporal edge values: PostgreSQL -> capture -> log -> Spark -> Delta -> verify.

A ``timestamp`` column added while streaming, instants outside the range of nanosecond timestamps read
back with ``deltalake``, a numeric's scale lowered (values rewritten without change events), and source
values no Python ``date`` holds read by verify.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from tests.cdc.helpers import replay, wait_for
from tests.derived_views.pipeline import capture, context, execute, rows, settings_for, sync, synced, through, verify_views

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]


def test_a_numeric_rounded_by_type_changes_while_streaming_reaches_the_views_also_in_a_rebuild(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """``numeric`` -> ``numeric(12,4)`` -> ``numeric(12)`` -> ``numeric`` while capture streams rounds
    123.4567 to 123 without a change event and ends on the type it started from: the table is read
    again, and the views hold 123, incrementally and after a rebuild."""
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE nums (id int PRIMARY KEY, num_val numeric(5, 2))",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO nums VALUES (1, 123.45), (2, -1.5)",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)

    def logged() -> dict[int, str]:
        return {int(str(row["id"])): str(row["num_val"]) for row in replay(tmp_path, "cdc.public.nums").values()}

    stop = threading.Event()
    streaming = Capture(settings, stop=stop, tuning=Tuning(discover_seconds=3600))
    running = threading.Thread(target=streaming.run)
    running.start()
    try:
        execute(
            pg_url,
            "ALTER TABLE nums ALTER COLUMN num_val TYPE numeric",
            "UPDATE nums SET num_val = 123.4567 WHERE id = 1",
        )
        wait_for(lambda: logged()[1] == "123.4567", what="the update")
        entry = lambda: streaming.ledger.entries.get("public.nums")  # noqa: E731
        wait_for(lambda: ":1700:-1:" in (getattr(entry(), "columns", None) or ""), what="the catalog looked at")
        execute(
            pg_url,
            "ALTER TABLE nums ALTER COLUMN num_val TYPE decimal(12, 4); INSERT INTO nums VALUES (4, 2.48); "
            "ALTER TABLE nums ALTER COLUMN num_val TYPE decimal(12); INSERT INTO nums VALUES (5, 1238); "
            "ALTER TABLE nums ALTER COLUMN num_val TYPE decimal; INSERT INTO nums VALUES (6, 1225.1)",
        )
        wait_for(lambda: logged().get(6) == "1225.1" and logged()[1] == "123", what="the rounded values in the log")
    finally:
        stop.set()
        running.join(60)
    sync(ctx, ["warehouse"])
    verify_views(ctx, pg_url, ["warehouse"])
    current = warehouse.current_path(ctx, "public.nums")
    expected = {1: Decimal(123), 2: Decimal(-2), 4: Decimal(2), 5: Decimal(1238), 6: Decimal("1225.1")}
    assert {row["id"]: Decimal(row["num_val"]) for row in rows(spark, current)} == expected
    sync(ctx, ["warehouse"], replace=True)
    verify_views(ctx, pg_url, ["warehouse"])
    assert {row["id"]: Decimal(row["num_val"]) for row in rows(spark, current)} == expected


def test_a_timestamp_column_added_while_streaming_enters_the_views_incrementally_and_in_a_rebuild(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """A ``timestamp`` column (Spark's ``timestamp_ntz``, which needs Delta's ``timestampNtz`` table
    feature) added to tables created without one: a sync step adds it to both warehouse tables, a rebuild
    overwrites a table with it, and ``deltalake`` reads every table back."""
    from deltalake import DeltaTable

    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE stepped (id int PRIMARY KEY, v text)",
        "CREATE TABLE rebuilt (id int PRIMARY KEY, v text)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO stepped VALUES (1, 'a')",
        "INSERT INTO rebuilt VALUES (1, 'a')",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    through(settings, ctx)
    execute(
        pg_url,
        "ALTER TABLE stepped ADD COLUMN ts timestamp",
        "ALTER TABLE stepped ADD COLUMN tss timestamp[]",
        "INSERT INTO stepped VALUES (2, 'b', '1000-06-15 01:02:03.456789', '{9999-12-31 23:59:59.999999}')",
    )
    through(settings, ctx)  # a step: the columns are added to the existing tables
    execute(
        pg_url,
        "ALTER TABLE rebuilt ADD COLUMN ts timestamp",
        "INSERT INTO rebuilt VALUES (2, 'b', '2026-11-27 12:00:00.5')",
    )
    capture(settings)
    sync(ctx, ["warehouse"], replace=True)  # a rebuild: the existing table is overwritten with the column
    verify_views(ctx, pg_url, ["warehouse"])
    expected = {
        "public.stepped": {1: None, 2: datetime(1000, 6, 15, 1, 2, 3, 456789)},
        "public.rebuilt": {1: None, 2: datetime(2026, 11, 27, 12, 0, 0, 500000)},
    }
    for table, values in expected.items():
        for path in (warehouse.current_path(ctx, table), warehouse.history_path(ctx, table)):
            frame = DeltaTable(path).to_pandas()
            read = {int(i): None if pd.isna(t) else t.to_pydatetime() for i, t in zip(frame["id"], frame["ts"], strict=True)}
            assert read == values, path
    stepped = DeltaTable(warehouse.current_path(ctx, "public.stepped")).to_pandas()
    assert [[_micros(t) for t in v] for v in stepped[stepped["id"] == 2]["tss"]] == [[datetime(9999, 12, 31, 23, 59, 59, 999999)]]


def _micros(value: Any) -> datetime:
    """A ``numpy.datetime64`` as the Python datetime it holds (pandas gives array elements that way)."""
    return value.astype("datetime64[us]").item()  # type: ignore[no-any-return]


EDGE_INSTANTS = {
    1: datetime(1000, 6, 15, 1, 2, 3, 456789, tzinfo=UTC),
    2: datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    3: datetime(1, 1, 1, tzinfo=UTC),
    4: datetime(2026, 11, 27, 12, 0, tzinfo=UTC),
}


def test_instants_outside_the_nanosecond_range_read_back_exactly_with_deltalake(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    """``timestamptz`` values before 1677-09-21 and after 2262-04-11 are stored in microseconds, so
    ``deltalake`` (``DeltaTable.to_pandas()``, and the SQL reads of verify) reads them as the source holds them."""
    from deltalake import DeltaTable

    from derived_views.views import warehouse

    values = ", ".join(f"({i}, '{t.isoformat()}', ARRAY['{t.isoformat()}']::timestamptz[])" for i, t in EDGE_INSTANTS.items())
    execute(
        pg_url,
        "CREATE TABLE instants (id int PRIMARY KEY, tz timestamptz, tzs timestamptz[])",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        f"INSERT INTO instants VALUES {values}",
    )
    settings = settings_for(pg_url, tmp_path)
    ctx = context(spark, settings)
    assert through(settings, ctx) == len(EDGE_INSTANTS)  # verify reads with deltalake: exact
    execute(pg_url, "UPDATE instants SET tz = tz - interval '1 microsecond' WHERE id = 2")
    through(settings, ctx)
    expected = {**EDGE_INSTANTS, 2: EDGE_INSTANTS[2] - timedelta(microseconds=1)}
    for path in (warehouse.current_path(ctx, "public.instants"), warehouse.history_path(ctx, "public.instants")):
        frame = DeltaTable(path).to_pandas()
        if "_cdc_is_current" in frame:
            frame = frame[frame["_cdc_is_current"]]
        assert {int(i): t.to_pydatetime() for i, t in zip(frame["id"], frame["tz"], strict=True)} == expected, path
        # array elements come back as numpy datetimes (UTC, no zone), in microseconds
        assert {int(i): [_micros(t) for t in ts] for i, ts in zip(frame["id"], frame["tzs"], strict=True)} == {
            i: [t.replace(tzinfo=None)] for i, t in EDGE_INSTANTS.items()
        }, path


def test_verify_reads_dates_python_cannot_hold_without_failing(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    """A source ``date[]`` holding ``infinity`` (and dates BC or past 9999 beside it) is read by verify;
    every row is compared, and a difference, if any, names the row that holds such a value."""
    from derived_views.runs.verify import verify

    execute(
        pg_url,
        "CREATE TABLE days (id int PRIMARY KEY, d date, ds date[], ts timestamp, tz timestamptz)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO days VALUES (1, '2020-01-02', '{2020-01-02}', '2020-01-02 03:04:05', '2020-01-02 03:04:05+00')",
        "INSERT INTO days VALUES (2, '2020-01-03', '{infinity,-infinity,0044-03-15 BC,10000-01-01}', 'infinity', '-infinity')",
    )
    ctx, watermark = synced(spark, pg_url, tmp_path)
    report = verify(ctx, "warehouse", pg_url, watermark)
    assert report.compared == 2
    assert all("key ('2',)" in line for line in report.differences), report.differences
