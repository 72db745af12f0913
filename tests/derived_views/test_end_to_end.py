"""PostgreSQL -> capture -> log -> Spark -> Delta, checked with ``verify`` against the source."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.config.settings import Settings
    from derived_views.write.context import ViewContext

from tests.derived_views.conftest import EXAMPLE_VIEWS
from tests.derived_views.pipeline import read_every_view_table

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

ALL = ["warehouse", "search.products", "cache.order"]
BIG = "(SELECT string_agg(md5(g::text || 'x'), '') FROM generate_series(1, 3200) g)"  # ~100 kB, incompressible
#: Changes of every kind to the seeded tables: a TOAST value set and then left unchanged, updates, deletes,
#: a truncate (with cascade), an insert, a column added then set, and a column added with a default
CHANGES = (
    f"UPDATE products SET description = {BIG} WHERE id = 1",
    "UPDATE products SET price = 99.50, name = 'Brass lamp' WHERE id = 2",
    "DELETE FROM order_items WHERE line_no = 3",
    "UPDATE orders SET status = 'paid' WHERE customer_id = 2",
    # gives the existing rows a value without a change event: the schema record carries it, the views apply it
    "ALTER TABLE categories ADD COLUMN slug text NOT NULL DEFAULT 'none'",
    "UPDATE categories SET name = 'Lights' WHERE id = 2",
    "DELETE FROM products WHERE id = 20",
    "TRUNCATE customers CASCADE",
    "INSERT INTO customers (email, name) VALUES ('new@x', 'New')",
    "ALTER TABLE products ADD COLUMN weight numeric(6, 2)",
    "UPDATE products SET weight = 1.25 WHERE id = 3",
    "UPDATE products SET price = 12.00 WHERE id = 1",  # leaves the 100 kB description unchanged (TOAST)
)


def _exec(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _seed(url: str, products: int = 20) -> None:
    _exec(
        url,
        "INSERT INTO categories (name) VALUES ('Lighting'), ('Garden'), ('Kitchen')",
        "INSERT INTO customers (email, name) SELECT 'c' || g || '@x', 'Customer ' || g FROM generate_series(1, 5) g",
        f"INSERT INTO products (category_id, name, description, price, attributes, tags) "
        f"SELECT 1 + g % 3, 'Product ' || g, 'about product ' || g, 10 + g * 0.25, "
        f"jsonb_build_object('n', g, 'nested', jsonb_build_object('ok', true)), ARRAY['t' || g % 4, 'all'] "
        f"FROM generate_series(1, {products}) g",
        "INSERT INTO orders (customer_id, status, total) SELECT 1 + g % 5, 'pending', g FROM generate_series(1, 6) g",
        "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
        "SELECT o.id, l, l, l, 9.95 FROM orders o, generate_series(1, 3) l",
    )


def _settings(url: str, data_dir: Path) -> Settings:
    from cdc.config.settings import load_settings

    return load_settings(database_url=url, data_dir=str(data_dir), views_file=str(EXAMPLE_VIEWS))


def _capture(settings: Settings) -> None:
    from cdc.run.coordinator import Capture

    Capture(settings, once=True).run()


def _context(spark: SparkSession, settings: Settings) -> ViewContext:
    from cdc.config.view_arguments import context_from_settings

    return context_from_settings(settings, spark)


def _verify_all(ctx: ViewContext, url: str, views: list[str] = ALL) -> None:
    from derived_views.runs import runner
    from derived_views.runs.verify import verify

    watermark = runner.latest(ctx)
    assert watermark is not None
    for view in views:
        report = verify(ctx, view, url, watermark)
        assert report.ok, report.differences[:10]
        assert report.compared > 0 or view == "cache.order"  # TRUNCATE customers CASCADE empties orders


def test_changes_schema_change_toast_compaction_rebuild_and_verify(
    spark: SparkSession, reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc.cli import cli, run
    from cdc.commands import register
    from derived_views.runs import runner
    from derived_views.views import warehouse
    from log_store import LogStore

    settings = _settings(reference_db, tmp_path)
    _seed(reference_db)
    _capture(settings)
    ctx = _context(spark, settings)
    runner.step(ctx, ALL)
    _verify_all(ctx, reference_db)

    _exec(reference_db, *CHANGES)
    _capture(settings)
    runner.step(ctx, ALL)
    _verify_all(ctx, reference_db)
    # every view table is readable by deltalake (pandas and Polars users read Delta with it)
    tables = read_every_view_table(tmp_path)
    assert {"warehouse/current/public.products", "search/products/terms", "cache/order/entries"} <= set(tables)
    assert tables["warehouse/current/public.products"] == 19
    row = spark.read.format("delta").load(warehouse.current_path(ctx, "public.products")).filter("id = 1").first()
    assert row is not None and len(row["description"]) == 3200 * 32 and str(row["price"]) == "12.00"
    categories = spark.read.format("delta").load(warehouse.current_path(ctx, "public.categories"))
    assert {row["slug"] for row in categories.select("slug").collect()} == {"none"}  # every existing row filled

    with LogStore.open(Path(settings.log_dir), settings.log_config(), writer=True) as log:
        log.roll()
        log.compact()
    runner.step(ctx, ["warehouse"], replace=True)  # search and cache rebuilds: see test_views
    _verify_all(ctx, reference_db, ["warehouse"])

    # a deliberately altered row is caught, through the CLI (same process, same Spark session)
    spark.sql(f"UPDATE delta.`{warehouse.current_path(ctx, 'public.categories')}` SET name = 'tampered' WHERE id = 1")
    monkeypatch.setenv("CDC_DATABASE_URL", reference_db)
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CDC_VIEWS_FILE", str(EXAMPLE_VIEWS))
    register(cli)
    assert run(cli, ["verify", "warehouse", "--no-sync"]) == 4
    assert run(cli, ["verify", "search", "--no-sync"]) == 0


def test_kill_minus_9_during_sync_then_resume_is_exact(spark: SparkSession, reference_db: str, tmp_path: Path) -> None:
    from derived_views.runs import runner
    from derived_views.runs.verify import verify

    settings = _settings(reference_db, tmp_path)
    _seed(reference_db, products=500)
    _capture(settings)
    ctx = _context(spark, settings)
    runner.step(ctx, ["warehouse"])
    first = runner.latest(ctx)
    assert first is not None
    _exec(
        reference_db,
        "UPDATE categories SET name = name || '!'",
        "UPDATE products SET price = price + 1 WHERE id % 7 = 0",
        "DELETE FROM products WHERE id % 11 = 0",
    )
    _capture(settings)
    env = {**os.environ, "CDC_DATABASE_URL": reference_db, "CDC_DATA_DIR": str(tmp_path), "CDC_SPARK_MASTER": "local[1]"}
    process = subprocess.Popen(
        [sys.executable, "-c", "from cdc.cli import main; main()", "sync", "warehouse", "--once"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # tables are synced source table by source table (categories first, products last): kill after the
    # first commit of categories, while products' tables are still behind
    mid_sync = tmp_path / "warehouse" / "current" / "public.categories" / "_delta_log" / "00000000000000000001.json"
    deadline = time.monotonic() + 240
    try:
        while not mid_sync.exists():
            assert process.poll() is None, "sync ended before it could be killed"
            assert time.monotonic() < deadline, "sync made no commit in time"
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    history_log = tmp_path / "warehouse" / "history" / "public.products" / "_delta_log"
    current_log = tmp_path / "warehouse" / "current" / "public.products" / "_delta_log"
    assert not (current_log / "00000000000000000001.json").exists(), "killed too late to test a resume"
    ctx.forget()
    assert _each_table_exact_as_of_its_progress(ctx, tmp_path, first.lsn) >= 1  # categories' current table moved on
    runner.step(ctx, ["warehouse"])
    watermark = runner.latest(ctx)
    assert watermark is not None
    report = verify(ctx, "warehouse", reference_db, watermark)
    assert report.ok, report.differences[:10]
    history = spark.read.format("delta").load(str(history_log.parent))
    assert history.filter("_cdc_is_current").count() == spark.read.format("delta").load(str(current_log.parent)).count()


def _each_table_exact_as_of_its_progress(ctx: ViewContext, scratch: Path, first_lsn: int) -> int:
    """Every warehouse table (its current and history tables, applied side by side in two sessions)
    holds exactly what replaying the log up to the offsets its newest commit records gives, so no commit
    carried another table's progress; returns how many tables moved past ``first_lsn``."""
    from dataclasses import replace as with_fields

    from derived_views.runs import runner
    from derived_views.source.as_of import LogAsOf
    from derived_views.source.table_step import TableStep
    from derived_views.source.watermark import LogWatermark
    from derived_views.views import warehouse
    from derived_views.write.scd2 import merge_history
    from derived_views.write.steps import apply_state, load_pending

    latest = runner.latest(ctx)
    assert latest is not None
    moved = 0
    for name, schema in sorted(ctx.schemas(latest).items()):
        for kind, path in (("current", warehouse.current_path(ctx, name)), ("history", warehouse.history_path(ctx, name))):
            progress = ctx.progress(path)
            assert progress.position, path
            moved += progress.lsn > first_lsn
            as_of = LogAsOf(ctx.log, LogWatermark(progress.position, progress.watermark_ts_ms, progress.offsets))
            replayed = str(scratch / "replayed" / kind / name)
            if kind == "current":
                step = TableStep(as_of, [schema.topic], replayed, "latest", replace=True)
                apply_state(ctx, step, schema, str(scratch / "replayed" / "_dead_letter"))
            else:
                step = TableStep(as_of, [schema.topic], replayed, "all", replace=True)
                batch = load_pending(ctx, step, schema, dead_letter_path=str(scratch / "replayed" / "_dead_letter"))
                # the batch's truncates, written anew (no append, no fill)
                merge_history(ctx.spark, with_fields(batch.step, fills=()), batch.frame, types=ctx.types)
                batch.release()
            have = sorted(repr(sorted(r.asDict().items())) for r in ctx.spark.read.format("delta").load(path).collect())
            want = sorted(repr(sorted(r.asDict().items())) for r in ctx.spark.read.format("delta").load(replayed).collect())
            assert have == want, (path, set(have) ^ set(want))
    ctx.forget()
    return moved
