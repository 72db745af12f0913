"""``cdc capture`` serves Prometheus metrics that a real HTTP client can scrape."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from local_servers.postgres import free_port
from tests.cdc.helpers import wait_for

CDC = Path(sys.executable).with_name("cdc")


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def _scrape_or_empty(port: int) -> dict[str, float]:
    try:
        return _scrape(port)
    except OSError:
        return {}


def _slot_streaming(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'metrics_slot'").fetchone()
    return bool(row and row[0])


def test_capture_metrics_endpoint(reference_db: str, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "CDC_DATABASE_URL": reference_db,
        "CDC_DATA_DIR": str(tmp_path / "data"),
        "CDC_METRICS_PORT": str(port),
        "CDC_SLOT": "metrics_slot",
    }
    process = subprocess.Popen([str(CDC), "capture"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "cdc_capture_confirmed_lsn" in _scrape_or_empty(port), what="metrics endpoint")
        wait_for(lambda: _slot_streaming(reference_db), what="capture streaming from its slot")
        with psycopg.connect(reference_db) as conn:
            conn.execute("INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 25) g")
        wait_for(lambda: _scrape(port).get("cdc_capture_events_total", 0) >= 25, what="25 captured events")
        metrics = _scrape(port)
        assert metrics["cdc_capture_transactions_total"] >= 1
        assert metrics["cdc_capture_bytes_total"] > 0
        assert metrics["cdc_capture_confirmed_lsn"] > 0
        assert metrics["cdc_capture_reconnects_total"] == 0
        assert "cdc_capture_wal_bytes_behind" in metrics and "cdc_capture_seconds_behind" in metrics
        # the slot's health, measured from PostgreSQL at the scrape, as `cdc lag --serve` serves it
        assert metrics["cdc_source_up"] == 1 and metrics["cdc_slot_exists"] == 1
        assert metrics["cdc_slot_active"] == 1
        assert metrics["cdc_slot_wal_status"] == 1  # one status of the four is the slot's
        assert metrics["cdc_slot_retained_wal_bytes"] >= metrics["cdc_slot_wal_bytes_behind"] >= 0
        assert metrics["cdc_slot_catalog_xmin_age"] >= 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr.decode()
