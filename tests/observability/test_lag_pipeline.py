"""Lag across the whole pipeline, and read-your-writes with ``cdc wait``, against real parts.

Capture and sync run in this process (the shared Spark session); ``cdc lag --json`` and ``cdc wait`` run
as the user runs them, as subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import orjson
import psycopg
import pytest
from rich.console import Console

from cdc.config.settings import Settings, load_settings
from cdc.observe.lag_report import JSON_SCHEMA
from cdc.run.coordinator import Capture
from migrations.sample_data import insert_sample_data
from tests.derived_views.conftest import EXAMPLE_VIEWS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

CDC = Path(sys.executable).with_name("cdc")


def _env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "CDC_DATABASE_URL": settings.database_url,
        "CDC_DATA_DIR": str(settings.data_dir),
        "CDC_SLOT": settings.slot,
        "CDC_VIEWS_FILE": str(settings.views_file),
    }


def _lag(settings: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run([str(CDC), "lag", "--json", *args], env=_env(settings), capture_output=True, text=True, timeout=120)
    assert result.stdout, result.stderr
    report = orjson.loads(result.stdout)
    jsonschema.validate(report, JSON_SCHEMA)
    return result.returncode, report


def _exported(settings: Settings) -> dict[tuple[str, str], float]:
    """What ``cdc lag --serve`` serves of each view, read with Prometheus's own text parser."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from cdc.observe.lag_exporter import exporter_registry

    text = generate_latest(exporter_registry(settings)).decode()
    return {
        (sample.name, sample.labels["view"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "view" in sample.labels
    }


def _sync(spark: SparkSession, settings: Settings) -> None:
    from cdc.config import view_arguments
    from derived_views.runs import runner

    runner.step(view_arguments.context_from_settings(settings, spark), [])  # every defined view


def _wait(settings: Settings, lsn: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CDC), "wait", "warehouse", "--lsn", lsn, "--timeout", str(timeout), "--poll", "0.1"],
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )


def test_lag_grows_while_capture_is_stopped_and_returns_to_zero(spark: SparkSession, reference_db: str, tmp_path: Path) -> None:
    settings = load_settings(database_url=reference_db, data_dir=tmp_path / "data", slot="lag_e2e", views_file=EXAMPLE_VIEWS)
    insert_sample_data(reference_db, customers=5, products=10, orders=5)
    Capture(settings, once=True).run()
    _sync(spark, settings)
    status, caught_up = _lag(settings)
    assert status == 0
    assert {view["view"] for view in caught_up["views"]} == {"warehouse", "search.products", "cache.order"}
    assert all(view["events_pending"] == 0 for view in caught_up["views"])
    tables = {table["table"]: table for table in caught_up["tables"]}
    products = tables["warehouse/current/public.products"]
    assert sorted(products["views"]) == ["search.products", "warehouse"], products
    assert products["files"] >= 1 and products["bytes"] > 0 and products["version"] >= 0, products
    assert products["last_maintenance_at"] is None and products["seconds_since_maintenance"] is None, products
    assert {"search/products/documents", "cache/order/entries", "warehouse/history/public.orders"} <= set(tables)

    with psycopg.connect(reference_db) as conn:
        conn.execute("UPDATE products SET price = price + 1")
        conn.execute("INSERT INTO categories (name) SELECT 'extra ' || g FROM generate_series(1, 50) g")
        conn.commit()
        # read after the commit, as `cdc wait` asks: inside the open transaction the WAL write position
        # may not have moved yet, and the view (as of the last heartbeat) would already "reach" it
        after_commit = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]

    status, behind = _lag(settings, "--max-wal-bytes", "0")
    assert status == 1 and behind["ok"] is False
    assert behind["source"]["wal_bytes_behind"] > caught_up["source"]["wal_bytes_behind"]
    assert behind["source"]["oldest_unconfirmed_age_seconds"] > 0
    assert behind["log"]["watermark"] == caught_up["log"]["watermark"]
    not_yet = _wait(settings, after_commit, timeout=0.5)
    assert not_yet.returncode == 4
    assert "did not reach" in not_yet.stderr

    Capture(settings, once=True).run()
    _, captured = _lag(settings)
    assert captured["source"]["oldest_unconfirmed_age_seconds"] == 0.0
    pending = {view["view"]: view for view in captured["views"]}
    assert pending["warehouse"]["events_pending"] >= 60
    assert pending["search.products"]["events_pending"] > 0
    exported = _exported(settings)  # the exporter's figures are cdc lag's
    for view in captured["views"]:
        assert exported["cdc_lag_view_events_pending", view["view"]] == view["events_pending"]
        assert exported["cdc_lag_view_wal_bytes_behind", view["view"]] == view["wal_bytes_behind"]
        assert exported["cdc_lag_view_seconds_behind", view["view"]] == pytest.approx(view["seconds_behind"])
        assert exported["cdc_lag_view_synced", view["view"]] == 1

    _sync(spark, settings)
    status, synced = _lag(settings, "--max-lag-seconds", "0")
    assert status == 0, synced["violations"]
    for view in synced["views"]:
        assert view["events_pending"] == 0
        assert view["seconds_behind"] == 0
        assert view["wal_bytes_behind"] == 0
        assert view["as_of_lsn"] == synced["log"]["watermark"]["lsn"]
    exported = _exported(settings)
    assert {view for _, view in exported} == {"warehouse", "search.products", "cache.order"}
    assert all(value == 0 for (name, _), value in exported.items() if name != "cdc_lag_view_synced")
    done = _wait(settings, after_commit, timeout=30)
    assert done.returncode == 0, done.stderr

    # a compaction: lag shows the table's fewer files and when it was maintained, as JSON and as text
    from cdc.commands.lag_cmd import render
    from cdc.config import view_arguments
    from cdc.observe.lag import measure
    from derived_views.engine.maintenance import MaintenancePolicy
    from derived_views.runs import runner

    before = {table["table"]: table for table in synced["tables"]}["warehouse/current/public.categories"]
    ctx = view_arguments.context_from_settings(settings, spark)
    compacted = runner.maintain(ctx, [], MaintenancePolicy(small_files=2), ["warehouse/current/public.categories"], dry_run=False)
    assert [task.action for task in compacted] == ["compact"] and before["files"] > 1, before
    _, maintained = _lag(settings)
    categories = {table["table"]: table for table in maintained["tables"]}["warehouse/current/public.categories"]
    assert categories["files"] == 1 and categories["version"] == before["version"] + 1, categories
    assert categories["versions_since_compaction"] == 0 and categories["last_maintenance_at"], categories
    assert 0 <= categories["seconds_since_maintenance"] < 600, categories
    console = Console(record=True, width=200)
    console.print(render(measure(settings)))
    shown = [line for line in console.export_text().splitlines() if "warehouse/current/public.categories" in line]
    assert len(shown) == 1 and "0 versions" in shown[0] and "ago" in shown[0], shown
