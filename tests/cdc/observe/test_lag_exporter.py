"""``cdc lag --serve``: slot health, the log's and the views' lag as Prometheus metrics, with capture
stopped, read with Prometheus's own text parser; the shipped alert rules and dashboard name only metrics
it serves.

One database and one exporter (a real ``cdc`` process) serve the whole module: capture ran once and
stopped, so the slot is inactive and the warehouse view has never synced.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from cdc.config.settings import load_settings
from cdc.run.coordinator import Capture
from local_servers.postgres import free_port
from tests.cdc.helpers import wait_for
from tests.fix_pg import PgServer, _drop_database, _with_database

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "cdc-slot-health.json"
SLOT = "exporter_slot"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Exporter:
    port: int
    process: subprocess.Popen[bytes]
    stderr: Path

    def scrape(self) -> tuple[set[str], Samples]:
        """The family names and every sample, read with Prometheus's own parser."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as response:
            text = response.read().decode()
        names, samples = set(), {}
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            for sample in family.samples:
                samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
        return names, samples

    def answers(self) -> bool:
        try:
            self.scrape()
        except OSError:
            return False
        return True


def _start(env: dict[str, str], tmp: Path) -> Exporter:
    """``cdc lag --serve`` as its own process, logging every module it imports (``-X importtime``)."""
    port = free_port()
    stderr = tmp / f"exporter-{port}.stderr"
    command = [sys.executable, "-X", "importtime", "-c", "from cdc.cli import main; main()", "lag", "--serve", str(port)]
    with stderr.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    exporter = Exporter(port, process, stderr)
    wait_for(lambda: exporter.answers() or process.poll() is not None, what="the exporter's endpoint")
    assert process.poll() is None, stderr.read_text()[-2000:]
    return exporter


def _stop(exporter: Exporter) -> None:
    exporter.process.send_signal(signal.SIGTERM)
    assert exporter.process.wait(timeout=30) == 0, exporter.stderr.read_text()[-2000:]


@pytest.fixture(scope="module")
def source(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A reference database captured once (capture stopped since), and the settings' environment.

    ``max_slot_wal_keep_size`` is set (generously) for the module so that the slot has a ``safe_wal_size``."""
    from cdc.setup import migrate

    database = f"cdc_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '64GB'")
        admin.execute("SELECT pg_reload_conf()")
    url = _with_database(pg_server.url, database)
    data = tmp_path_factory.mktemp("exporter")
    try:
        migrate.upgrade(url)
        with psycopg.connect(url) as conn:
            conn.execute("INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 50) g")
        settings = load_settings(database_url=url, slot=SLOT, data_dir=data / "data", views_file=data / "none.toml")
        Capture(settings, once=True).run()
        yield {
            **os.environ,
            "CDC_DATABASE_URL": url,
            "CDC_SLOT": SLOT,
            "CDC_DATA_DIR": str(settings.data_dir),
            "CDC_VIEWS_FILE": str(settings.views_file),
        }
    finally:
        _drop_database(pg_server.url, database)
        with psycopg.connect(pg_server.url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            admin.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="module")
def exporter(source: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    running = _start(source, tmp_path_factory.mktemp("exporter-logs"))
    try:
        yield running
    finally:
        _stop(running)


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


def test_serves_the_slot_the_log_and_the_views(exporter: Exporter) -> None:
    _, samples = exporter.scrape()
    assert _value(samples, "cdc_source_up", slot=SLOT) == 1
    assert _value(samples, "cdc_slot_exists", slot=SLOT) == 1
    assert _value(samples, "cdc_slot_active", slot=SLOT) == 0  # capture is stopped
    assert _value(samples, "cdc_slot_wal_status", slot=SLOT, status="reserved") == 1
    assert _value(samples, "cdc_slot_wal_status", slot=SLOT, status="lost") == 0
    assert 63 << 30 < _value(samples, "cdc_slot_safe_wal_size_bytes", slot=SLOT) < 65 << 30  # about the 64GB kept
    assert _value(samples, "cdc_slot_catalog_xmin_age", slot=SLOT) >= 0
    assert _value(samples, "cdc_log_up") == 1
    assert _value(samples, "cdc_log_watermark_lsn") > 0
    # the warehouse has never synced: the 50 rows captured are pending
    assert _value(samples, "cdc_lag_view_synced", view="warehouse") == 0
    assert _value(samples, "cdc_lag_view_events_pending", view="warehouse") >= 50


def test_retained_wal_grows_while_the_primary_writes(exporter: Exporter, source: dict[str, str]) -> None:
    _, before = exporter.scrape()
    retained = _value(before, "cdc_slot_retained_wal_bytes", slot=SLOT)
    behind = _value(before, "cdc_slot_wal_bytes_behind", slot=SLOT)
    with psycopg.connect(source["CDC_DATABASE_URL"]) as conn:
        conn.execute("INSERT INTO categories (name) SELECT 'w' || g FROM generate_series(1, 2000) g")

    def grown() -> bool:
        _, now = exporter.scrape()
        return _value(now, "cdc_slot_retained_wal_bytes", slot=SLOT) > retained + 64 * 1024

    wait_for(grown, what="the retained WAL growing")
    _, after = exporter.scrape()
    assert _value(after, "cdc_slot_wal_bytes_behind", slot=SLOT) > behind
    assert _value(after, "cdc_slot_active", slot=SLOT) == 0


def _promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers that are no function call, keyword,
    label matcher, grouping label, range or string."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    keywords = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    keywords |= {"inf", "nan"}
    return {
        match[1]
        for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?!\s*\(|[\w])", text)
        if match[1].lower() not in keywords
    }


def test_the_name_parser_finds_selectors_only() -> None:
    found = _promql_metric_names('sum by (slot) (rate(a_total{x="b c"}[5m])) > on(slot) b_gauge * 2 and time() - c_ts')
    assert found == {"a_total", "b_gauge", "c_ts"}


def test_alert_rules_and_dashboard_name_only_served_metrics(exporter: Exporter) -> None:
    served, _ = exporter.scrape()
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    alerts = {rule["alert"] for rule in rules}
    assert {"CdcSlotRetainsTooMuchWal", "CdcSlotInactive", "CdcSlotWalNotReserved", "CdcViewBehind"} <= alerts
    for rule in rules:
        names = _promql_metric_names(str(rule["expr"]))
        assert names, rule
        assert names <= served, f"{rule['alert']} names {names - served}, which the exporter does not serve"
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        for target in panel["targets"]:
            names = _promql_metric_names(target["expr"])
            assert names and names <= served, f"panel {panel['title']!r} names {names - served}"


def test_the_exporter_never_imports_spark(exporter: Exporter) -> None:
    exporter.scrape()  # the views are listed at a scrape: their imports come then
    imported = {line.split("|")[-1].strip().split(".")[0] for line in exporter.stderr.read_text().splitlines() if "|" in line}
    assert {"cdc", "derived_views", "log_store"} <= imported  # the import log is read, and the views were listed
    assert not {"pyspark", "py4j", "delta"} & imported


def test_an_unreachable_source_serves_up_zero_and_keeps_serving(source: dict[str, str], tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret-pw\n")
    env = {**source, "CDC_DATABASE_URL": "postgresql://app@127.0.0.1:1/shop", "CDC_DATABASE_PASSWORD_FILE": str(password)}
    down = _start(env, tmp_path)
    try:
        for _ in range(2):
            names, samples = down.scrape()
            assert _value(samples, "cdc_source_up", slot=SLOT) == 0
            assert not any(name.startswith("cdc_slot_") for name in names)
            assert _value(samples, "cdc_log_up") == 1  # the log still answers
        assert down.process.poll() is None
    finally:
        _stop(down)
    logged = down.stderr.read_text()
    assert "cannot measure the slot" in logged
    assert "password=***" in logged and "s3cret-pw" not in logged  # the line names the URL, never its password
