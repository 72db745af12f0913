"""Prometheus metrics of the capture and sync processes, served over HTTP on ``CDC_METRICS_PORT``.

Each long-running process owns one :class:`prometheus_client.CollectorRegistry` with the metrics of its
role, so ``cdc capture`` and ``cdc sync --continuous`` can run in one container and be scraped apart.
Scrape ``http://HOST:PORT/metrics``. Port 0 turns the endpoint off. ``cdc sync --continuous`` also exports
each view table's files, bytes, version, commits since its last compaction and seconds since its last
maintenance (``cdc_view_table_*``, labelled by ``table``), read every ``CDC_MAINTENANCE_INTERVAL_S`` and
after each maintenance task. ``cdc capture``'s endpoint also serves the slot's health, measured from
PostgreSQL at each scrape (``cdc_source_up``, ``cdc_slot_*``: :mod:`cdc.observe.slot_metrics`), the gauges
``cdc lag --serve`` serves without a running capture (:mod:`cdc.observe.lag_exporter`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from threading import Thread
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily


@dataclass
class CaptureMetrics:
    """What ``cdc capture`` exports (all names start with ``cdc_capture_``)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events = Counter("cdc_capture_events", "Records appended to the log", registry=r)
        self.bytes = Counter("cdc_capture_bytes", "Bytes of record values appended to the log", registry=r)
        self.transactions = Counter("cdc_capture_transactions", "Source transactions appended", registry=r)
        self.confirmed_lsn = Gauge("cdc_capture_confirmed_lsn", "Last LSN confirmed to PostgreSQL as flushed", registry=r)
        self.wal_bytes_behind = Gauge(
            "cdc_capture_wal_bytes_behind", "Server WAL end minus the confirmed LSN, in bytes", registry=r
        )
        self.seconds_behind = Gauge(
            "cdc_capture_seconds_behind",
            "Append time minus commit time of the newest transaction appended",
            registry=r,
        )
        self.reconnects = Counter("cdc_capture_reconnects", "Reconnections to PostgreSQL", registry=r)
        self.errors = Counter("cdc_capture_errors", "Errors, by kind", ["kind"], registry=r)

    def group_durable(self, events: int, value_bytes: int, transactions: int, confirmed: int, commit_ts_ms: int | None) -> None:
        """A group became durable (snapshot groups have no commit time)."""
        self.transactions.inc(transactions)
        self.bytes.inc(value_bytes)
        self.events.inc(events)
        self.confirmed_lsn.set(confirmed)
        if commit_ts_ms is not None:
            self.seconds_behind.set(max(0.0, time.time() - commit_ts_ms / 1000))

    def caught_up(self, confirmed: int) -> None:
        """A heartbeat confirmed the server's WAL end: nothing is behind."""
        self.confirmed_lsn.set(confirmed)
        self.wal_bytes_behind.set(0)
        self.seconds_behind.set(0)


@dataclass
class SyncMetrics:
    """What ``cdc sync --continuous`` exports (all names start with ``cdc_view_``), labelled by view."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.batches = Counter("cdc_view_batches", "Batches applied", ["view"], registry=r)
        self.events = Counter("cdc_view_events", "Events applied", ["view"], registry=r)
        self.as_of_lsn = Gauge("cdc_view_as_of_lsn", "Commit LSN the view is as of", ["view"], registry=r)
        self.seconds_behind = Gauge(
            "cdc_view_seconds_behind",
            "Commit time of the newest captured change minus the view's as-of commit time",
            ["view"],
            registry=r,
        )
        self.last_sync = Gauge(
            "cdc_view_last_sync_timestamp_seconds", "When the view last finished a sync step", ["view"], registry=r
        )
        self.errors = Counter("cdc_view_errors", "Failed sync attempts", ["view"], registry=r)
        self._tables = _TableCollector()
        r.register(self._tables)

    def tables(self, figures: dict[str, TableFigures]) -> None:
        """The view tables' figures as last read, by table (each replaces what was known of every table)."""
        self._tables.tables = dict(figures)

    def observe(self, view: str, events: int, as_of_lsn: int) -> None:
        """Record a finished sync step of ``view``: it is at the newest watermark, nothing newer is captured."""
        self.batches.labels(view=view).inc()
        self.events.labels(view=view).inc(events)
        self.as_of_lsn.labels(view=view).set(as_of_lsn)
        self.seconds_behind.labels(view=view).set(0)
        self.last_sync.labels(view=view).set_to_current_time()


@dataclass(frozen=True)
class TableFigures:
    """One view table's files, bytes, versions and last maintenance, as ``cdc sync --continuous`` last read them."""

    files: int
    bytes: int
    version: int
    versions_since_compaction: int
    last_maintenance_at: float | None
    """When it was last compacted or vacuumed (a POSIX time; ``None``: never)."""


class _TableCollector:
    """The ``cdc_view_table_*`` gauges, labelled by table (its path below the views directory), from the
    figures last read; the seconds since a table's last maintenance are counted when scraped."""

    def __init__(self) -> None:
        self.tables: dict[str, TableFigures] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tables = dict(self.tables)
        gauges = {
            "files": GaugeMetricFamily("cdc_view_table_files", "Data files of the view table's newest version", labels=["table"]),
            "bytes": GaugeMetricFamily("cdc_view_table_bytes", "Bytes of those files", labels=["table"]),
            "version": GaugeMetricFamily("cdc_view_table_version", "The view table's newest Delta version", labels=["table"]),
            "since": GaugeMetricFamily(
                "cdc_view_table_versions_since_compaction", "Commits since the view table was last compacted", labels=["table"]
            ),
            "maintained": GaugeMetricFamily(
                "cdc_view_table_seconds_since_maintenance",
                "Seconds since the view table was last compacted or vacuumed (absent: never)",
                labels=["table"],
            ),
        }
        now = time.time()
        for table, figures in sorted(tables.items()):
            gauges["files"].add_metric([table], figures.files)
            gauges["bytes"].add_metric([table], figures.bytes)
            gauges["version"].add_metric([table], figures.version)
            gauges["since"].add_metric([table], figures.versions_since_compaction)
            if figures.last_maintenance_at is not None:
                gauges["maintained"].add_metric([table], max(0.0, now - figures.last_maintenance_at))
        yield from gauges.values()


def serve(registry: CollectorRegistry, port: int, address: str = "0.0.0.0") -> Any | None:
    """Start the ``/metrics`` HTTP endpoint in a daemon thread; returns the server (None when port is 0)."""
    if port == 0:
        return None
    server, thread = start_http_server(port, addr=address, registry=registry)
    assert isinstance(thread, Thread)
    return server
