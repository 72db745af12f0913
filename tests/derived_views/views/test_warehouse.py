"""Warehouse view over a hand-built log: inserts, updates, deletes, partial rows, idempotence."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.derived_views.log_builder import LogBuilder, product

if TYPE_CHECKING:
    from derived_views.write.context import ViewContext

pytestmark = pytest.mark.spark


def _current(ctx: ViewContext, table: str) -> dict[Any, dict[str, Any]]:
    from derived_views.views import warehouse

    rows = ctx.spark.read.format("delta").load(warehouse.current_path(ctx, table)).collect()
    return {row["id"]: row.asDict() for row in rows}


def _sync(ctx: ViewContext) -> None:
    from derived_views.runs import runner

    runner.step(ctx, ["warehouse"])


def test_insert_update_delete_with_faithful_types(ctx: ViewContext, log: LogBuilder) -> None:
    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "Home"})
        for pid in (1, 2, 3):
            tx.insert("public.products", product(pid, f"Lamp {pid}"))
    with log.transaction() as tx:
        tx.update("public.products", product(2, "Desk lamp", price="1234567890.12"))
        tx.delete("public.products", {"id": 3})
    _sync(ctx)
    rows = _current(ctx, "public.products")
    assert sorted(rows) == [1, 2]
    assert rows[2]["name"] == "Desk lamp"
    assert rows[2]["price"] == Decimal("1234567890.12")
    assert rows[1]["tags"] == ["home"]
    assert rows[1]["attributes"] == '{"color":"red"}'
    assert rows[1]["updated_at"].isoformat() == "2026-11-21T12:45:00.123456"
    schema = dict(
        ctx.spark.read.format("delta")
        .load(__import__("derived_views.views.warehouse").views.warehouse.current_path(ctx, "public.products"))
        .dtypes
    )
    assert schema["price"] == "decimal(12,2)" and schema["updated_at"] == "timestamp"
    assert schema["tags"] == "array<string>" and schema["id"] == "bigint"


def test_partial_row_keeps_unchanged_column_across_batches(ctx: ViewContext, log: LogBuilder) -> None:
    big = "x" * 100_000
    with log.transaction() as tx:
        tx.insert("public.products", product(7, description=big))
    _sync(ctx)
    with log.transaction() as tx:
        tx.update("public.products", product(7, "Renamed"), unchanged=("description",))
    with log.transaction() as tx:
        tx.update("public.products", product(7, "Renamed again"), unchanged=("description",))
    _sync(ctx)
    row = _current(ctx, "public.products")[7]
    assert row["name"] == "Renamed again" and row["description"] == big
    from derived_views.views import warehouse

    history = ctx.spark.read.format("delta").load(warehouse.history_path(ctx, "public.products"))
    versions = sorted(history.collect(), key=lambda r: r["_cdc_valid_from_lsn"])
    assert [v["name"] for v in versions] == ["Lamp", "Renamed", "Renamed again"]
    assert all(v["description"] == big for v in versions)
    assert [v["_cdc_is_current"] for v in versions] == [False, False, True]
    assert versions[0]["_cdc_valid_to_lsn"] == versions[1]["_cdc_valid_from_lsn"]


def test_same_batch_twice_and_older_batch_after_newer_change_nothing(ctx: ViewContext, log: LogBuilder) -> None:
    from derived_views.source.as_of import LogAsOf
    from derived_views.source.log_source import read_watermark
    from derived_views.views import warehouse

    with log.transaction() as tx:
        tx.insert("public.products", product(1))
    first = read_watermark(ctx.log)
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 1})
    second = read_watermark(ctx.log)
    assert first is not None and second is not None
    warehouse.sync(ctx, LogAsOf(ctx.log, second))
    version = ctx.spark.sql(f"DESCRIBE HISTORY delta.`{warehouse.current_path(ctx, 'public.products')}`").count()
    ctx.forget()
    warehouse.sync(ctx, LogAsOf(ctx.log, second))
    warehouse.sync(ctx, LogAsOf(ctx.log, first))
    assert _current(ctx, "public.products") == {}
    after = ctx.spark.sql(f"DESCRIBE HISTORY delta.`{warehouse.current_path(ctx, 'public.products')}`").count()
    assert after == version


def test_truncate_poison_and_schema_change(ctx: ViewContext, log: LogBuilder) -> None:
    from derived_views.views import warehouse
    from tests.derived_views.log_builder import REFERENCE, col

    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "Home"})
        tx.insert("public.categories", {"id": 2, "name": "Garden"})
    _sync(ctx)
    with log.transaction() as tx:
        tx.truncate("public.categories")
        tx.insert("public.categories", {"id": 3, "name": "Kitchen"})
        tx.insert("public.products", {**product(1), "price": "not a number"})
        tx.insert("public.products", product(2))
    log.alter("public.categories", [*REFERENCE["public.categories"], col("slug", "text")])
    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 4, "name": "Tools", "slug": "tools"})
    _sync(ctx)
    cats = _current(ctx, "public.categories")
    assert sorted(cats) == [3, 4]
    assert cats[4]["slug"] == "tools" and cats[3]["slug"] is None
    assert sorted(_current(ctx, "public.products")) == [2]
    dead = [
        r
        for r in ctx.spark.read.format("delta").load(warehouse.dead_letter_path(ctx)).collect()
        if r["target"] == warehouse.current_path(ctx, "public.products")
    ]
    assert len(dead) == 1 and '"not a number"' in dead[0]["value"]
    # the error names the column, the type it did not fit and the value, and no column that fits
    assert dead[0]["error"] == (
        "values do not fit the columns of public.products: column `price` (decimal(12,2)) cannot hold not a number"
    )
    history = ctx.spark.read.format("delta").load(warehouse.history_path(ctx, "public.categories")).collect()
    closed = {r["id"]: r for r in history if r["id"] in (1, 2)}
    assert all(not r["_cdc_is_current"] and r["_cdc_valid_to_seq"] == -1 for r in closed.values())
    assert {r["id"] for r in history if r["_cdc_is_current"]} == {3, 4}


def test_a_history_merge_rewrites_current_versions_only(ctx: ViewContext, log: LogBuilder) -> None:
    """A history table is partitioned by ``_cdc_is_current``: each step's MERGE rewrites the files of the
    current versions it ends, never the ended versions, however many earlier steps made."""
    from deltalake import DeltaTable

    from derived_views.views import warehouse
    from derived_views.write.table_keys import holds_any

    with log.transaction() as tx:
        for pid in range(1, 6):
            tx.insert("public.products", product(pid, f"Lamp {pid}"))
    _sync(ctx)
    history = warehouse.history_path(ctx, "public.products")
    assert DeltaTable(history).metadata().partition_columns == ["_cdc_is_current"]
    for round_ in range(1, 5):
        with log.transaction() as tx:
            tx.update("public.products", product(1, f"Lamp 1, take {round_}"))
        _sync(ctx)
        merge = DeltaTable(history).history(1)[0]
        assert merge["operation"] == "MERGE", merge
        metrics = {name: int(merge["operationMetrics"][name]) for name in ("numTargetRowsUpdated", "numTargetRowsCopied")}
        # the one version ended, and at most the other four current versions copied: no ended version
        assert metrics["numTargetRowsUpdated"] == 1 and metrics["numTargetRowsCopied"] <= 4, (round_, metrics)
    versions = ctx.spark.read.format("delta").load(history).filter("id = 1").collect()
    assert sorted(v["_cdc_is_current"] for v in versions) == [False, False, False, False, True]
    # deltalake's SQL reader filters the partition column (rule 7's look-up of current keys)
    assert holds_any(history, [versions[0]["_cdc_key"]], current_only=True) is True
    assert holds_any(history, ['{"id":99}'], current_only=True) is False


def test_tables_written_anew_are_applied_alone_and_the_others_side_by_side(
    ctx: ViewContext, log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's first build may take one pass, which may stop its own job on purpose: it runs beside no
    other table. Later steps apply tables side by side."""
    from derived_views.views import warehouse

    calls: list[tuple[str, bool]] = []
    apply_pair = warehouse._apply_table_pair

    def recording(*args: Any) -> Any:
        calls.append((args[2].path, args[-1]))  # the current table's step, and whether it goes alone
        return apply_pair(*args)

    monkeypatch.setattr(warehouse, "_apply_table_pair", recording)
    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "Home"})
        tx.insert("public.products", product(1))
    _sync(ctx)
    assert calls and all(alone for _, alone in calls), calls
    calls.clear()
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "House"})
        tx.update("public.products", product(1, "Renamed"))
    _sync(ctx)
    assert calls and not any(alone for _, alone in calls), calls
    assert _current(ctx, "public.categories")[1]["name"] == "House"


def _synced_products(ctx: ViewContext, log: LogBuilder, *ids: int) -> None:
    """Insert products ``ids`` in one transaction and sync the warehouse."""
    with log.transaction() as tx:
        for pid in ids:
            tx.insert("public.products", product(pid))
    _sync(ctx)


def test_delete_compacted_to_its_tombstone_still_deletes(ctx: ViewContext, log: LogBuilder) -> None:
    """A view that lags behind compaction sees only the tombstone of a deleted key, and deletes it."""
    from derived_views.views import warehouse

    _synced_products(ctx, log, 1, 2, 3)
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 2})
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 3})
    with log.transaction() as tx:
        tx.insert("public.products", product(3, "Back again"))
    log.heartbeat()
    log.log.roll()
    log.log.compact()
    kept = [
        r
        for p in range(log.partitions)
        for r in log.log.read(__import__("log_store").TopicPartition(log.topic("public.products"), p), 0)
    ]
    assert not any(r.value is not None and b'"op":"d"' in r.value for r in kept), "compaction kept a delete event"
    _sync(ctx)
    rows = _current(ctx, "public.products")
    assert sorted(rows) == [1, 3] and rows[3]["name"] == "Back again"
    history = ctx.spark.read.format("delta").load(warehouse.history_path(ctx, "public.products")).collect()
    current = sorted((r["id"], r["name"]) for r in history if r["_cdc_is_current"])
    assert current == [(1, "Lamp"), (3, "Back again")]


def _ids(ctx: ViewContext, path: str, current_only: bool = False) -> list[int]:
    rows = ctx.spark.read.format("delta").load(path).collect()
    return sorted(r["id"] for r in rows if not current_only or r["_cdc_is_current"])


@pytest.mark.parametrize("compacted", [False, True], ids=["same-batch", "behind-compaction"])
def test_reinsert_after_delete_never_duplicates_a_key(ctx: ViewContext, log: LogBuilder, compacted: bool) -> None:
    """A batch of inserts only may still meet its keys in the table: its delete was reduced away in the
    same batch, or removed by compaction together with its tombstone."""
    from derived_views.views import warehouse

    _synced_products(ctx, log, 1, 2, 3)
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 3})
    with log.transaction() as tx:
        tx.insert("public.products", product(3, "Back again"))
    if compacted:
        log.heartbeat()
        log.log.roll()
        log.log.compact()
    _sync(ctx)
    assert _ids(ctx, warehouse.current_path(ctx, "public.products")) == [1, 2, 3]
    assert _current(ctx, "public.products")[3]["name"] == "Back again"
    assert _ids(ctx, warehouse.history_path(ctx, "public.products"), current_only=True) == [1, 2, 3]


def test_reinsert_after_a_dead_lettered_delete_never_duplicates_a_key(ctx: ViewContext, log: LogBuilder) -> None:
    """A delete routed to the dead-letter table leaves its row in place, so a later insert-only batch
    of the same key must still meet it in the table (the batch alone looks like new keys)."""
    from derived_views.views import warehouse

    _synced_products(ctx, log, 1, 2, 3)
    with log.transaction() as tx:
        tx.raw("public.products", b'{"id":3}', b'{"op":"d","before":{"id":3,"name":"\xff"}}')
    _sync(ctx)
    assert ctx.spark.read.format("delta").load(warehouse.dead_letter_path(ctx)).count() == 2
    with log.transaction() as tx:
        tx.insert("public.products", product(3, "Back again"))
    _sync(ctx)
    assert _ids(ctx, warehouse.current_path(ctx, "public.products")) == [1, 2, 3]
    assert _current(ctx, "public.products")[3]["name"] == "Back again"
    assert _ids(ctx, warehouse.history_path(ctx, "public.products"), current_only=True) == [1, 2, 3]


def test_a_value_that_is_not_utf8_goes_to_the_dead_letter_table(ctx: ViewContext, log: LogBuilder) -> None:
    from derived_views.views import warehouse

    with log.transaction() as tx:
        tx.insert("public.products", product(1))
        tx.raw("public.products", b'{"id":2}', b'{"op":"c","after":{"id":2,"name":"\xff\xfe"}}')
    _sync(ctx)
    assert _ids(ctx, warehouse.current_path(ctx, "public.products")) == [1]
    dead = ctx.spark.read.format("delta").load(warehouse.dead_letter_path(ctx)).collect()
    # once per table that read it: the current-state and the history table
    assert sorted(r["target"] for r in dead) == sorted(
        [warehouse.current_path(ctx, "public.products"), warehouse.history_path(ctx, "public.products")]
    )
    assert all(r["key"] == '{"id":2}' and "\\xff" in r["value"] for r in dead)


def test_a_rebuild_writes_in_one_pass_unless_a_poison_event_or_a_truncate_needs_checking(
    ctx: ViewContext, log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild read by Spark tasks writes each table in the job that reads its events; a table whose
    events hold a poison event (or, for a history table, a truncate) stops that job before it commits
    and is rebuilt the checked way. Either way the tables are those the incremental syncs made, each
    in one commit."""
    from derived_views.runs import runner
    from derived_views.source import pending
    from derived_views.views import warehouse
    from derived_views.write import steps

    test_truncate_poison_and_schema_change(ctx, log)
    customer = {"id": 1, "email": "a@example.com", "name": "Ann", "created_at": "2026-11-21T12:45:00.123456Z"}
    with log.transaction() as tx:
        tx.insert("public.customers", customer)
        tx.insert("public.customers", {**customer, "id": 2})
    with log.transaction() as tx:
        tx.update("public.customers", {**customer, "name": "Anna"})
    _sync(ctx)
    paths = [
        warehouse.current_path(ctx, "public.categories"),
        warehouse.history_path(ctx, "public.categories"),
        warehouse.current_path(ctx, "public.products"),
        warehouse.history_path(ctx, "public.products"),
        warehouse.current_path(ctx, "public.customers"),
        warehouse.history_path(ctx, "public.customers"),
    ]

    def table(path: str) -> list[str]:  # a rebuild may order the columns otherwise
        return sorted(repr(sorted(row.asDict().items())) for row in ctx.spark.read.format("delta").load(path).collect())

    def version(path: str) -> int:
        return int(ctx.spark.sql(f"DESCRIBE HISTORY delta.`{path}`").agg({"version": "max"}).first()[0])

    incremental = {path: table(path) for path in paths}
    versions = {path: version(path) for path in paths}
    checked: list[str] = []
    load_pending = steps.load_pending

    def recording(*args: Any, **kwargs: Any) -> Any:
        checked.append(args[1].path)  # the table's step
        return load_pending(*args, **kwargs)

    monkeypatch.setattr(steps, "load_pending", recording)
    monkeypatch.setattr(pending, "DRIVER_READ_LIMIT", 0)
    report = runner.step(ctx, ["warehouse"], replace=True)
    assert not report.failures
    # categories' current table needs no check of its truncate (a history table does); both products
    # tables hold a poison event; the customers tables need nothing checked
    assert sorted(path for path in checked if path in paths) == sorted(paths[1:4])
    for path in paths:
        assert table(path) == incremental[path], path
        assert version(path) == versions[path] + 1, path
    dead = ctx.spark.read.format("delta").load(warehouse.dead_letter_path(ctx)).collect()
    assert sorted(r["target"] for r in dead) == sorted(paths[2:4])


def test_idle_tables_record_the_newer_watermark_without_a_commit(ctx: ViewContext, log: LogBuilder) -> None:
    """A step gives a table with no event no Delta version: its position moves on beside its log, and the
    view's readers (``cdc views``, ``cdc lag``, ``cdc wait``) see the table as of the step's watermark."""
    from deltalake import DeltaTable

    from derived_views.runs import runner
    from derived_views.runs.status import table_progress
    from derived_views.views import warehouse

    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "Home"})
        tx.insert("public.products", product(1, "Lamp"))
    _sync(ctx)
    idle = [path(ctx, "public.categories") for path in (warehouse.current_path, warehouse.history_path)]
    changed = [path(ctx, "public.products") for path in (warehouse.current_path, warehouse.history_path)]
    versions = {table: DeltaTable(table).version() for table in idle + changed}
    for name in ("Desk lamp", "Floor lamp"):
        with log.transaction() as tx:
            tx.update("public.products", product(1, name))
        report = runner.step(ctx, ["warehouse"])
        assert report.watermark is not None
        for table in idle + changed:
            recorded = table_progress(Path(table))
            assert recorded is not None and recorded.position == report.watermark.position, table
            ctx.forget()  # a new process reads the same
            assert ctx.progress(table).position == report.watermark.position, table
    assert {table: DeltaTable(table).version() for table in idle} == {table: versions[table] for table in idle}
    assert all(DeltaTable(table).version() == versions[table] + 2 for table in changed)
    assert _current(ctx, "public.products")[1]["name"] == "Floor lamp"
