"""Which version of a view table is exact as of a position: the spans read from its commits, the choice
of one position every table is exact as of, what a step records for it, and the retention that keeps
those versions readable (pure logic, and Delta tables written with ``deltalake``: no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from derived_views.engine.exact_versions import (
    Commit,
    Span,
    at,
    common_at_or_above,
    common_at_or_below,
    spans,
)
from derived_views.engine.maintenance import RETAIN, MaintenancePolicy, retention_properties, tasks_for
from derived_views.engine.progress import Progress
from derived_views.engine.table_health import table_health
from derived_views.errors import AsOfError
from derived_views.runs.as_of_reads import lsn_text, parse_lsn, select_versions
from derived_views.source.as_of import LogAsOf
from derived_views.source.log_location import LogLocation
from derived_views.source.watermark import LogWatermark

HOUR_MS = 3600 * 1000


def progress(position: int, since: int | None = None, prior: int | None = None) -> Progress:
    """A commit's progress as of ``position``, holding events up to ``since``, its previous data exact up to ``prior``."""
    return Progress(
        {"t": {"0": position}},
        f"{position:016X}",
        0,
        since=f"{since:016X}" if since is not None else "",
        prior=f"{prior:016X}" if prior is not None else "",
    )


def test_each_commit_with_progress_is_exact_from_its_newest_event_to_where_the_next_one_found_it() -> None:
    commits = [
        Commit(0, 1000, "CREATE TABLE"),
        Commit(1, 1001, "WRITE", progress(100, since=90)),
        Commit(2, 1002, "MERGE", progress(200, since=150, prior=120)),  # idle steps had moved it to 120
        Commit(3, 1003, "OPTIMIZE"),  # same rows: the span moves to the compacted version
        Commit(4, 1004, "MERGE", progress(300, since=250, prior=200)),
        Commit(5, 1005, "ADD COLUMNS"),  # another schema: the span keeps the version before it
        Commit(6, 1006, "SET TBLPROPERTIES"),
        Commit(7, 1007, "WRITE", progress(400, since=401)),  # holds an event past its position: exact as of none
    ]
    assert spans(commits[:7], reached=320) == [
        Span(1, 90, 120, replaced_ms=1002),
        Span(3, 150, 200, replaced_ms=1004),
        Span(4, 250, 320, replaced_ms=1005),
    ]
    assert spans(reversed(commits)) == spans(commits)  # any order
    assert [s.version for s in spans(commits)] == [1, 3, 4]
    # a commit of an earlier version records neither: its position alone
    assert spans([Commit(9, 1, "MERGE", progress(500)), Commit(10, 2, "MERGE", progress(600))]) == [
        Span(9, 500, 500, 2),
        Span(10, 600, 600, None),
    ]


def test_the_version_chosen_is_the_newest_exact_one_and_a_step_jumped_over_has_none() -> None:
    table = [Span(1, 90, 120, 1002), Span(3, 150, 200, 1004), Span(5, 200, 320)]
    assert at(table, 100) == table[0]
    assert at(table, 200) == table[2]  # both are exact as of 200: the newest
    assert at(table, 130) is None and at(table, 80) is None and at(table, 321) is None
    assert not table[0].readable(1003) and table[1].readable(1003) and table[2].readable(10**15)


def test_one_position_every_table_is_exact_as_of() -> None:
    tables = {
        "orders": [Span(1, 90, 120), Span(2, 150, 300)],
        "order_items": [Span(1, 95, 260), Span(2, 280, 400)],
        "documents": [Span(4, 100, 200)],  # a view not synced past 200
    }

    def spans_of(name: str, _: int) -> list[Span]:
        return tables[name]

    assert common_at_or_below(spans_of, tables, 200) == 200
    assert common_at_or_below(spans_of, tables, 140) == 120  # orders went from 120 to 150 in one step
    assert common_at_or_below(spans_of, ["orders", "order_items"], 400) == 300
    assert common_at_or_below(spans_of, ["orders", "order_items"], 270) == 260
    assert common_at_or_below(spans_of, tables, 94) is None
    apart = {"a": [Span(1, 0, 10), Span(2, 20, 30)], "b": [Span(1, 0, 15)]}  # b reached 15, which a jumped over
    assert common_at_or_below(lambda name, _: apart[name], apart, 30) == 10
    assert common_at_or_above(tables, 0) == 100 and common_at_or_above(tables, 121) == 150
    assert common_at_or_above(tables, 201) is None


def test_a_step_records_the_newest_event_held_and_where_the_previous_data_was_last_exact() -> None:
    as_of = LogAsOf(LogLocation(path="/nowhere"), LogWatermark("0000000000000200", 7, {"t": {"0": 9}}))
    before = progress(0x120, since=0x90, prior=0x100)
    applied = as_of.progress(["t"], before, since=0x180)
    assert (applied.position, applied.since, applied.prior, applied.offsets) == (
        "0000000000000200",
        "0000000000000180",
        before.position,
        {"t": {"0": 9}},
    )
    assert Progress.from_json(applied.to_json()) == applied
    idle = as_of.unchanged(["t"], before)  # no event: the data, and so its newest event, is the same
    assert (idle.since_lsn, idle.lsn) == (0x90, 0x200)
    rebuilt = as_of.progress(["t"], None)
    assert (rebuilt.since, rebuilt.prior, rebuilt.since_lsn) == ("", "", 0x200)  # unknown: the position alone
    earlier = Progress.from_json('{"cdc-progress":1,"position":"0000000000000010","watermark_ts_ms":0,"offsets":{}}')
    assert earlier is not None and earlier.since_lsn == 0x10 and "since" not in earlier.to_json()


def test_lsns_are_read_as_pg_prints_them() -> None:
    assert parse_lsn("1/2A") == (1 << 32) | 0x2A and parse_lsn(" latest ") is None and parse_lsn(None) is None
    assert lsn_text((1 << 32) | 0x2A) == "1/2A"
    for bad in ("1/2/3", "x/1", "0/0", "123", ""):
        with pytest.raises(AsOfError, match="is not an LSN such as 0/16B3748"):
            parse_lsn(bad)


def _table(path: Path, commits: list[Progress | None]) -> str:
    """A Delta table written with ``deltalake``, one commit per entry, each carrying its progress."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    for number, recorded in enumerate(commits):
        metadata = {"userMetadata": recorded.to_json()} if recorded else {}
        write_deltalake(
            str(path), pa.table({"n": [number]}), mode="overwrite", commit_properties=CommitProperties(custom_metadata=metadata)
        )
    return str(path)


def test_versions_are_chosen_from_the_tables_logs_and_their_position_files(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from derived_views.engine.positions import record_position

    orders = _table(tmp_path / "orders", [None, progress(0x100, since=0x90), progress(0x300, since=0x250, prior=0x200)])
    items = _table(tmp_path / "items", [None, progress(0x100, since=0x80)])
    tables = {"orders": orders, "items": items}
    assert select_versions(tables).position == 0x100  # items has reached no further
    idle = progress(0x300, since=0x80)
    record_position(items, idle, progress(0x100, since=0x80))  # a step found nothing for items
    latest = select_versions(tables, "latest")
    assert (latest.position, latest.lsn, latest.as_of) == (0x300, "0/301", "0/300")
    assert (latest.version("orders"), latest.version("items"), latest.path("items")) == (2, 1, items)
    older = select_versions(tables, "0/181")  # every commit before 0/181: up to position 0x180
    assert {name: t.version for name, t in older.tables.items()} == {"orders": 1, "items": 1}
    assert DeltaTable(orders, version=older.version("orders")).to_pyarrow_table()["n"].to_pylist() == [1]

    with pytest.raises(
        AsOfError,
        match=r"no version of orders is exact as of LSN 0/221: its versions are exact as of LSNs up to 0/201 and from 0/251 on",
    ):
        select_versions(tables, "0/221")
    with pytest.raises(AsOfError, match=r"LSN 0/302 is newer than what the views have reached .*cdc wait VIEW --lsn 0/302"):
        select_versions(tables, "0/302")
    with pytest.raises(AsOfError, match="LSN 0/50 is older than what the views keep readable"):
        select_versions(tables, "0/50")
    with pytest.raises(AsOfError, match="missing has no version synced yet: run `cdc sync` first"):
        select_versions({**tables, "missing": str(tmp_path / "missing")})
    # a version replaced longer ago than the retention is not offered: its files may be vacuumed
    later = int(DeltaTable(orders).history(1)[0]["timestamp"]) + 3 * HOUR_MS
    assert select_versions(tables, "0/181", retention_hours=4, now_ms=later).position == 0x180
    with pytest.raises(AsOfError, match="older than what the views keep readable .*RETENTION_HOURS=2 keeps"):
        select_versions(tables, "0/181", retention_hours=2, now_ms=later)
    assert select_versions(tables, retention_hours=2, now_ms=later).position == 0x300


def test_maintenance_raises_the_delta_retentions_below_the_vacuum_retention(tmp_path: Path) -> None:
    week, month = MaintenancePolicy(retention_hours=168), MaintenancePolicy(retention_hours=800)
    assert retention_properties({}, week) == {}  # Delta's defaults: 30 days of log, 7 days of removed files
    assert retention_properties({}, month) == {
        "delta.logRetentionDuration": "interval 800 hours",
        "delta.deletedFileRetentionDuration": "interval 800 hours",
    }
    held = {"delta.logRetentionDuration": "interval 5 weeks", "delta.deletedFileRetentionDuration": "INTERVAL 34 days"}
    assert retention_properties(held, month) == {}
    assert retention_properties({"delta.logRetentionDuration": "interval 2 days"}, week) == {
        "delta.logRetentionDuration": "interval 168 hours"
    }
    assert retention_properties({"delta.deletedFileRetentionDuration": "soon"}, week) == {
        "delta.deletedFileRetentionDuration": "interval 168 hours"
    }
    path = _table(tmp_path / "t", [progress(0x10)])
    health = table_health(path, week.small_file_bytes)
    assert [t.action for t in tasks_for(path, month, health)] == [RETAIN] and tasks_for(path, week, health) == []
