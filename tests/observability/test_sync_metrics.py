"""``cdc sync --continuous`` serves per-view Prometheus metrics, and each view table's files, bytes and
versions, that a real HTTP client can scrape."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdc.config.settings import load_settings
from cdc.run.coordinator import Capture
from local_servers.postgres import free_port
from migrations.sample_data import insert_sample_data
from tests.cdc.helpers import wait_for
from tests.observability.test_capture_metrics import _scrape, _scrape_or_empty

pytestmark = pytest.mark.spark

CDC = Path(sys.executable).with_name("cdc")


#: The reference schema's tables.
REFERENCE_TABLES = ("categories", "customers", "products", "orders", "order_items")


def table_figures(port: int) -> dict[str, dict[str, float]]:
    """The ``cdc_view_table_*`` gauges the endpoint serves: name -> table -> value (none while unreachable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("cdc_view_table_"):
                found.setdefault(sample.name, {})[sample.labels["table"]] = sample.value
    return found


def test_sync_metrics_endpoint(reference_db: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    insert_sample_data(reference_db, customers=3, products=5, orders=3)
    watermark_lsn = 0
    settings = load_settings(database_url=reference_db, data_dir=data_dir)
    Capture(settings, once=True).run()
    from log_store import LogStore

    with LogStore.open(settings.log_dir) as store:
        watermark = store.latest_watermark()
        assert watermark is not None
        watermark_lsn = int(watermark.position, 16)
    port = free_port()
    env = {**os.environ, "CDC_DATABASE_URL": reference_db, "CDC_DATA_DIR": str(data_dir), "CDC_METRICS_PORT": str(port)}
    process = subprocess.Popen(
        [str(CDC), "sync", "warehouse", "--continuous", "--interval", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: _scrape_or_empty(port).get("cdc_view_batches_total", 0) >= 1,
            timeout=240,
            what="a finished sync step",
        )
        metrics = _scrape(port)
        assert metrics["cdc_view_events_total"] >= 3 + 5 + 3
        assert metrics["cdc_view_as_of_lsn"] == watermark_lsn
        assert metrics["cdc_view_seconds_behind"] == 0
        assert metrics["cdc_view_last_sync_timestamp_seconds"] > 0
        assert metrics.get("cdc_view_errors_total", 0) == 0
        # each table's files, bytes and versions, read after the step (never maintained: no seconds since)
        wanted = {f"warehouse/{kind}/public.{table}" for kind in ("current", "history") for table in REFERENCE_TABLES}
        wait_for(lambda: wanted <= set(table_figures(port).get("cdc_view_table_files", {})), timeout=120, what="table figures")
        figures = table_figures(port)
        assert all(figures["cdc_view_table_files"][table] >= 1 for table in wanted), figures
        assert all(figures["cdc_view_table_bytes"][table] > 0 for table in wanted), figures
        assert all(figures["cdc_view_table_versions_since_compaction"][table] >= 1 for table in wanted), figures
        assert figures["cdc_view_table_version"]["warehouse/current/public.products"] >= 0
        assert figures.get("cdc_view_table_seconds_since_maintenance", {}) == {}
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr.decode()[-2000:]
