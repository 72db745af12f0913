"""Prometheus metrics of the capture and sync processes, served over HTTP on ``CDC_METRICS_PORT``.

Each long-running process owns one :class:`prometheus_client.CollectorRegistry` with the metrics of its
role, so ``cdc capture`` and ``cdc sync --continuous`` can run in one container and be scraped apart.
Scrape ``http://HOST:PORT/metrics``. Port 0 turns the endpoint off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from threading import Thread
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


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

    def observe(self, view: str, events: int, as_of_lsn: int) -> None:
        """Record a finished sync step of ``view``: it is at the newest watermark, nothing newer is captured."""
        self.batches.labels(view=view).inc()
        self.events.labels(view=view).inc(events)
        self.as_of_lsn.labels(view=view).set(as_of_lsn)
        self.seconds_behind.labels(view=view).set(0)
        self.last_sync.labels(view=view).set_to_current_time()


def serve(registry: CollectorRegistry, port: int, address: str = "0.0.0.0") -> Any | None:
    """Start the ``/metrics`` HTTP endpoint in a daemon thread; returns the server (None when port is 0)."""
    if port == 0:
        return None
    server, thread = start_http_server(port, addr=address, registry=registry)
    assert isinstance(thread, Thread)
    return server
