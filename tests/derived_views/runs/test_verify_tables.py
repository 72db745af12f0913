"""``cdc verify`` of a table larger than it holds at once: compared by bucket hashes, then row by row in the
buckets that differ, in memory that does not grow with the table, each difference named by key and column;
so are a search index's documents and a cache entity's entries over it."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from derived_views.events.schema import Column, TableSchema
from tests.derived_views.pipeline import execute, synced
from tests.derived_views.runs.test_verify_values import DIFFERENT, SAME

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROWS = 30_000
#: Python memory a verify of ROWS rows may hold at its peak: a batch of rows and the buckets' figures, not
#: the table (held whole as Python objects, both sides take over 40 MB).
PEAK_BYTES = 16 << 20
#: Each item's group (a join) and parts (children, three per item for the first 1,000 items).
GROUPS, PARTS = 6, 3_000
VIEWS = """
[search.items]
root = "public.t"
text = ["name", "label"]
filter = "n >= -2"

[search.items.joins.g]
table = "public.groups"
on = "n"
columns = { label = "label" }

[cache.item]
root = "public.t"
columns = ["id", "price", "f", "r", "name"]

[cache.item.lookups.g]
table = "public.groups"
on = "n"
columns = { label = "label" }

[cache.item.children.parts]
table = "public.parts"
on = "item_id"
order_by = "pos"
"""
COMPOSITES = ("search.items", "cache.item")


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.slow
def test_a_large_table_is_verified_in_bounded_memory_and_each_difference_named(
    spark: SparkSession, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of ROWS rows (negative integers, NaN and negative zero, float4, decimals) verifies equal with
    a bounded peak of Python memory, and so do a search index (a join, a filter) and a cache entity (a
    lookup, children) over it; then a row deleted from the view, one added, -1 turned into -2 (which
    Python hashes alike) and -0.0 into 0.0 (which compare equal) are each named, and so are, once the
    source has moved on, a root deleted, a root's column, a child's column and a joined column changed,
    and a root that left the index's filter."""
    from pyspark.sql import functions as F

    from derived_views.runs import verify_composites, verify_tables
    from derived_views.runs.verify import verify
    from derived_views.views import warehouse

    execute(
        pg_url,
        "CREATE TABLE t (id bigint PRIMARY KEY, n int, price numeric(12,2), f float8, r real, name text)",
        "CREATE TABLE groups (id int PRIMARY KEY, label text)",
        "CREATE TABLE parts (id bigint PRIMARY KEY, item_id bigint, pos int, note text)",
        "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
        "INSERT INTO t SELECT g, g % 7 - 3, ((g * 37) % 99900 + 100) / 100.0, "
        "CASE WHEN g % 11 = 0 THEN 'NaN'::float8 WHEN g % 13 = 0 THEN '-0'::float8 ELSE g / 7.0 END, g / 3.0, 'item ' || g "
        f"FROM generate_series(1, {ROWS}) g",
        f"INSERT INTO groups SELECT g, 'g' || g FROM generate_series(-3, {GROUPS - 4}) g",  # n = 3 finds no group
        "INSERT INTO parts SELECT g, g % 1000 + 1, CASE WHEN g % 17 <> 0 THEN g % 5 END, 'n ' || g "
        f"FROM generate_series(1, {PARTS}) g",
    )
    views_file = tmp_path / "views.toml"
    views_file.write_text(VIEWS)
    ctx, watermark = synced(spark, pg_url, tmp_path, ("warehouse", *COMPOSITES), views_file=str(views_file))
    monkeypatch.setattr(verify_tables, "HELD_ROWS", 1_000, raising=False)  # compared by hash at a test's size
    monkeypatch.setattr(verify_composites, "FILTERED", 2_000, raising=False)

    reports, peaks = {}, {}
    tracemalloc.start()
    try:
        for view in ("warehouse", *COMPOSITES):
            tracemalloc.reset_peak()
            reports[view] = verify(ctx, view, pg_url, watermark)
            peaks[view] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # every item passes the filter but those with n = -3 (id divisible by 7)
    compared = {"warehouse": ROWS + GROUPS + PARTS, "search.items": ROWS - ROWS // 7, "cache.item": ROWS}
    for view, report in reports.items():
        assert report.ok, (view, report.differences[:5])
        assert report.compared == compared[view], view
        assert peaks[view] < PEAK_BYTES, f"verify {view} held {peaks[view] / 2**20:.1f} MB of Python memory at its peak"

    current = warehouse.current_path(ctx, "public.t")
    spark.sql(f"DELETE FROM delta.`{current}` WHERE id = 5")
    added = spark.read.format("delta").load(current).filter("id = 7").withColumn("id", F.lit(ROWS + 1).cast("bigint"))
    added.write.format("delta").mode("append").save(current)
    spark.sql(f"UPDATE delta.`{current}` SET n = -2 WHERE id = 2")  # the source holds -1
    spark.sql(f"UPDATE delta.`{current}` SET f = 0.0 WHERE id = 13")  # the source holds -0
    assert verify(ctx, "warehouse", pg_url, watermark).differences == [
        "public.t: key ('5',) is in the source but not in the view",
        f"public.t: key ('{ROWS + 1}',) is in the view but not in the source",
        "public.t: key ('13',) column f: source '-0' != view 0.0",
        "public.t: key ('2',) column n: source -1 != view -2",
    ]

    # the source moves on, the composites stay as they were
    execute(
        pg_url,
        "DELETE FROM t WHERE id = 9",
        "UPDATE t SET name = 'renamed' WHERE id = 12",
        "UPDATE t SET n = -3 WHERE id = 15",  # out of the index's filter, and another group
        "UPDATE parts SET note = 'changed' WHERE id = 1010",  # item 11's second part (its three have pos 0)
    )
    assert verify(ctx, "search.items", pg_url, watermark).differences == [
        "search.items documents: key ('15',) is in the view but not in the source",
        "search.items documents: key ('9',) is in the view but not in the source",
        "search.items documents: key ('12',) column name: source 'renamed' != view 'item 12'",
    ]
    assert verify(ctx, "cache.item", pg_url, watermark).differences == [
        "cache.item entries: key ('9',) is in the view but not in the source",
        "cache.item entries: key ('11',) parts[1] note: source 'changed' != view 'n 1010'",
        "cache.item entries: key ('12',) column name: source 'renamed' != view 'item 12'",
        "cache.item entries: key ('15',) column label: source 'g-3' != view 'g-2'",
    ]


def test_differences_past_the_kept_ones_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view that differs everywhere: the first KEPT differences are listed, the buckets left counted."""
    from derived_views.runs import verify_tables
    from derived_views.runs.verify_tables import Layout, Report, compare_table

    monkeypatch.setattr(verify_tables, "HELD_ROWS", 100)
    monkeypatch.setattr(verify_tables, "KEPT", 10)
    schema = TableSchema("public", "t", "cdc.public.t", (Column("id", "int8", key=True), Column("v", "text")))
    source = [[(i, f"v{i}") for i in range(5_000)]]
    view = [[(i, f"w{i}") for i in range(5_000)]]
    report = Report("warehouse")
    assert compare_table("t", Layout.of(schema), lambda: source, lambda: view, 5_000, report) == 5_000
    assert not report.ok
    assert len(report.differences) == 10 + 1
    assert report.count > 10 + 1  # the rest of the read buckets counted
    assert all(" column v: source 'v" in line for line in report.differences[:-1])
    assert report.differences[-1].startswith("t: ") and report.differences[-1].endswith("view rows), not listed")


def _differences(type_name: str, source: Any, view: Any, held: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Differences of two 1,200-row tables equal but for key 7's value of column c, compared at once
    (``held`` above their size) or by hash."""
    from derived_views.runs import verify_tables
    from derived_views.runs.verify_tables import Layout, Report, compare_table

    monkeypatch.setattr(verify_tables, "HELD_ROWS", held)
    schema = TableSchema("public", "t", "cdc.public.t", (Column("id", "int8", key=True), Column("c", type_name)))
    sides = [[[(i, value if i == 7 else None) for i in range(1_200)]] for value in (source, view)]
    report = Report("warehouse")
    compare_table("t", Layout.of(schema), lambda: sides[0], lambda: sides[1], 1_200, report)
    return report.differences


@pytest.mark.parametrize("held", [100, 10_000], ids=["by hash", "at once"])
@pytest.mark.parametrize(("type_name", "source", "view"), [*SAME, ("numeric", Decimal("1.50"), Decimal("1.500000000000000000"))])
def test_a_value_and_its_view_form_compare_equal(
    type_name: str, source: Any, view: Any, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _differences(type_name, source, view, held, monkeypatch) == []


@pytest.mark.parametrize(
    ("type_name", "source", "view"),
    [
        *DIFFERENT,
        ("int4", -1, -2),
        ("numeric", Decimal("-1"), Decimal("-2")),
        ("numeric", Decimal("1." + "0" * 40 + "1"), Decimal("1." + "0" * 40 + "2")),
        ("int8", 1, 1 + (1 << 61) - 1),
        ("_text", ["a", None], ["a", "None"]),
    ],
)
@pytest.mark.parametrize("held", [100, 10_000], ids=["by hash", "at once"])
def test_a_changed_value_is_found(type_name: str, source: Any, view: Any, held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values Python hashes alike or finds equal (-1 and -2, integers 2**61 - 1 apart, 0.0 and -0.0) are
    told apart too."""
    differences = _differences(type_name, source, view, held, monkeypatch)
    assert len(differences) == 1 and differences[0].startswith("t: key ('7',) column c: "), differences


@pytest.mark.parametrize(
    ("type_name", "source", "view", "reads", "line"),
    [
        # JSON spelled otherwise: hashed by its comparable form from the first read
        ("jsonb", '{{"n": {}}}', '{{"n":{}}}', 2, "source {'n': 7} != view {'n': -7}"),
        # text a view holds as numbers: its hash is of another form, so every bucket differs at first
        ("varchar", "{}", None, 3, "source '7' != view '-7'"),
    ],
)
def test_a_column_held_in_another_form_everywhere_costs_at_most_one_more_read(
    type_name: str, source: str, view: str | None, reads: int, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column the view holds in another form in every row: when its hashes differ, every bucket differs,
    so both sides are hashed again by each value's comparable form; either way only the bucket that truly
    differs (key 7) is read again."""
    from derived_views.runs import verify_tables
    from derived_views.runs.verify_tables import Layout, Report, compare_table

    monkeypatch.setattr(verify_tables, "HELD_ROWS", 100)
    schema = TableSchema("public", "t", "cdc.public.t", (Column("id", "int8", key=True), Column("doc", type_name)))
    sides = [
        [[(i, source.format(i)) for i in range(5_000)]],
        [[(i, view.format(-i if i == 7 else i) if view else (-i if i == 7 else i)) for i in range(5_000)]],
    ]
    read = [0, 0]

    def side(which: int) -> list[list[tuple[int, Any]]]:
        read[which] += 1
        return sides[which]

    report = Report("warehouse")
    compare_table("t", Layout.of(schema), lambda: side(0), lambda: side(1), 5_000, report)
    assert report.differences == [f"t: key ('7',) column doc: {line}"]
    assert read == [reads, reads]  # hashed (and hashed again by comparable forms), the differing bucket read again


_UTC = UTC


@pytest.mark.parametrize(
    ("type_name", "view_type", "view", "source", "odd"),
    [
        ("int8", pa.int64(), [1, -1, None, -(1 << 62)], [1, -1, None, -(1 << 62)], "x"),
        (
            "float8",
            pa.float64(),
            [0.1, -0.0, float("nan"), float("inf"), None],
            [0.1, -0.0, float("nan"), float("inf"), None],
            "x",
        ),
        ("float4", pa.float32(), [0.1, -2.5, None], ["0.1", "-2.5", None], "x"),
        ("numeric", pa.decimal128(12, 2), [Decimal("12.30"), Decimal("-1.00"), None], ["12.3", "-1", None], "NaN"),
        ("numeric", pa.string(), ["12.30", "NaN", "100", None], [Decimal("12.3"), "NaN", "100.00", None], 7),
        ("date", pa.date32(), [date(2020, 2, 29), None], ["2020-02-29", None], "infinity"),
        ("timestamp", pa.timestamp("us"), [datetime(2020, 1, 1, 12, 0, 0, 500000)], ["2020-01-01 12:00:00.5"], "infinity"),
        (
            "timestamptz",
            pa.timestamp("us", tz="UTC"),
            [datetime(2020, 1, 1, tzinfo=_UTC), None],
            ["2020-01-01 00:00:00+00", None],
            "-infinity",
        ),
        ("bool", pa.bool_(), [True, False, None], [True, False, None], "x"),
        ("text", pa.string(), ["a", "", None], ["a", "", None], 1),
    ],
)
def test_a_value_hashes_alike_from_either_side_and_one_at_a_time(
    type_name: str, view_type: pa.DataType, view: list[Any], source: list[Any], odd: Any
) -> None:
    """A column hashed at once from the view's Arrow array, at once from the source's Python values (the
    server's text for decimals, dates and instants), and one value at a time (a batch Arrow cannot cast
    whole, for a value no fixed-width form holds) gives each value the same hash."""
    from derived_views.runs.verify_hashes import Column, Kind

    column = Column.of(type_name, view_type)
    assert column.kind is not Kind.OTHER
    from_view = column.hashes(pa.array(view, type=view_type)).tolist()
    one_by_one = column.hashes([*source, odd]).tolist()
    assert from_view == column.hashes(source).tolist() == one_by_one[:-1]
    assert one_by_one[-1] not in from_view


def test_a_view_read_as_arrow_batches_is_compared_by_hash_and_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The view's rows as ``deltalake`` reads them (Arrow record batches, text as string views, a decimal
    column of the view's scale) against the source's rows (Python values, decimals as the server's text):
    equal rows cost nothing more, a changed value and a missing row are named."""
    from derived_views.runs import verify_tables
    from derived_views.runs.verify_tables import Layout, Report, compare_table

    monkeypatch.setattr(verify_tables, "HELD_ROWS", 100)
    schema = TableSchema(
        "public", "t", "cdc.public.t", (Column("id", "int8", key=True), Column("name", "text"), Column("price", "numeric"))
    )
    source = [[(i, f"n{i}", f"{i}.50") for i in range(1_200)]]
    names = ["n7-changed" if i == 7 else f"n{i}" for i in range(1_199)]
    view = pa.RecordBatch.from_arrays(
        [
            pa.array(range(1_199), type=pa.int64()),
            pa.array(names).cast(pa.string_view()),
            pa.array([Decimal(f"{i}.5") for i in range(1_199)], type=pa.decimal128(12, 2)),
        ],
        names=["c0", "c1", "c2"],
    )
    report = Report("warehouse")
    types = [pa.int64(), pa.string_view(), pa.decimal128(12, 2)]
    assert compare_table("t", Layout.of(schema), lambda: source, lambda: [view], 1_200, report, types) == 1_200
    assert report.differences == [
        "t: key ('1199',) is in the source but not in the view",
        "t: key ('7',) column name: source 'n7' != view 'n7-changed'",
    ]
